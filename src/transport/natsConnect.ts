/**
 * Connecting to NATS for `serve`, the CLI and the client: the options of src/config/natsConnection.ts,
 * and a failure mapped once, here, to what a person can act on. A refused authentication fails at
 * once naming the server (nats.js gives up on an authorization error rather than retrying it), with
 * no secret in the message.
 */
import type { ConnectionOptions, NatsConnection } from "@nats-io/transport-node"
import { connect, errors } from "@nats-io/transport-node"
import { Effect } from "effect"
import type { NatsConnectionSettings } from "../config/natsConnection.js"
import { connectionOptions, redactUrl, scrubSecrets, secretsOf } from "../config/natsConnection.js"
import type { SettingsInvalid } from "../config/SettingsInvalid.js"
import { NatsConnectFailed, reasonOf } from "./errors.js"

/** Why a connect failed, in words; authentication and TLS failures say which they are. */
export const connectFailureReason = (cause: unknown, secrets: ReadonlyArray<string>): string =>
  describeConnectFailure(cause, secrets).reason

/** The reason, and whether trying again can help (not for credentials or TLS, which stay wrong). */
const describeConnectFailure = (
  cause: unknown,
  secrets: ReadonlyArray<string>
): { readonly reason: string; readonly transient: boolean } => {
  const reason = reasonOf(cause)
  const scrubbed = scrubSecrets(reason, secrets)
  if (cause instanceof errors.AuthorizationError || /authori[sz]ation violation/i.test(reason))
    return { reason: `the server refused the credentials (${scrubbed})`, transient: false }
  if (cause instanceof errors.UserAuthenticationExpiredError)
    return { reason: `the user's credentials have expired (${scrubbed})`, transient: false }
  if (/certificate|self[- ]signed|tls|ssl|handshake/i.test(reason))
    return { reason: `TLS failed: ${scrubbed}`, transient: false }
  return { reason: scrubbed, transient: true }
}

/**
 * Connects with `settings` (files read now) and `extra` options on top (name, reconnect policy). Fails
 * with SettingsInvalid for a bad file and NatsConnectFailed (servers redacted) for a refused connection.
 */
export const connectNats = (
  settings: NatsConnectionSettings,
  extra: Partial<ConnectionOptions> = {}
): Effect.Effect<NatsConnection, SettingsInvalid | NatsConnectFailed> =>
  Effect.flatMap(connectionOptions(settings), (options) =>
    Effect.tryPromise({
      try: () => connect({ ...options, ...extra }),
      catch: (cause) =>
        new NatsConnectFailed({
          servers: settings.servers.map(redactUrl).join(","),
          ...describeConnectFailure(cause, secretsOf(settings))
        })
    })
  )
