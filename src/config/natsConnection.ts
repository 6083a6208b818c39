/**
 * The NATS connection, one module for `serve`, every CLI subcommand and `QuotaClient.connect`: the
 * environment names the `nats` command-line tool reads (PROTOCOL.md "Connecting and permissions"),
 * turned into nats.js connection options with the client's own authenticators and TLS options.
 *
 *   NATS_URL                    servers, comma-separated (`tls://` requires TLS)
 *   NATS_USER + NATS_PASSWORD   user and password
 *   NATS_TOKEN                  a token
 *   NATS_CREDS                  a .creds file (user JWT and nkey seed): credsAuthenticator
 *   NATS_NKEY                   a file holding an nkey seed: nkeyAuthenticator
 *   NATS_CA, NATS_CERT, NATS_KEY  TLS: the CA of the server's certificate; a client certificate and key
 *
 * At most one way to authenticate is given. A file that is missing, unreadable or not what its
 * variable says fails here, naming the variable and the path. Secrets (passwords, tokens, seeds, a
 * password inside a URL) never leave this module except inside the connection options: `describe`
 * and `redactUrl` are what logs and errors show.
 */
import { readFile } from "node:fs/promises"
import type { Authenticator, ConnectionOptions } from "@nats-io/transport-node"
import {
  credsAuthenticator,
  nkeyAuthenticator,
  tokenAuthenticator,
  usernamePasswordAuthenticator
} from "@nats-io/transport-node"
import { Effect } from "effect"
import { SettingsInvalid } from "./SettingsInvalid.js"
import type { Environment } from "./SettingsInvalid.js"

/** The connection as configured; files are named here and read by `connectionOptions`. */
export interface NatsConnectionSettings {
  readonly servers: ReadonlyArray<string>
  readonly user?: string
  readonly password?: string
  readonly token?: string
  readonly credsFile?: string
  readonly nkeyFile?: string
  readonly caFile?: string
  readonly certFile?: string
  readonly keyFile?: string
}

/** Which environment variable each setting comes from, for errors. */
const variables = {
  servers: "NATS_URL",
  user: "NATS_USER",
  password: "NATS_PASSWORD",
  token: "NATS_TOKEN",
  credsFile: "NATS_CREDS",
  nkeyFile: "NATS_NKEY",
  caFile: "NATS_CA",
  certFile: "NATS_CERT",
  keyFile: "NATS_KEY"
} as const satisfies Record<keyof NatsConnectionSettings, string>

export const natsUrlDefault = "nats://127.0.0.1:4222"

const invalid = (variable: string, reason: string) => new SettingsInvalid({ variable, reason })

/**
 * A URL with its password (or a token in the user part) replaced by `***`, and `password=` query
 * parameters too: what logs and errors show of NATS_URL and DATABASE_URL.
 */
export const redactUrl = (url: string): string =>
  url
    .replace(/^([a-z][a-z0-9+.-]*:\/\/)([^@/?#]*)@/i, (_match, scheme: string, userInfo: string) => {
      const colon = userInfo.indexOf(":")
      // No colon: the user part is a token (nats://token@host) or a bare user name of a database URL.
      if (colon < 0) return /^nats|^tls|^wss?/i.test(scheme) ? `${scheme}***@` : `${scheme}${userInfo}@`
      return `${scheme}${userInfo.slice(0, colon)}:***@`
    })
    .replace(/([?&](?:password|pass|token)=)[^&#]*/gi, "$1***")

/** Several URLs, comma-separated, each redacted. */
export const redactUrls = (urls: string): string =>
  urls
    .split(",")
    .map((url) => redactUrl(url.trim()))
    .join(",")

const valueOf = (env: Environment, variable: string): string | undefined => {
  const value = env[variable]
  return value === undefined || value.trim() === "" ? undefined : value.trim()
}

const checkServers = (
  servers: ReadonlyArray<string>
): Effect.Effect<ReadonlyArray<string>, SettingsInvalid> =>
  servers.length > 0 && servers.every((server) => server !== "" && !/\s/.test(server))
    ? Effect.succeed(servers)
    : Effect.fail(
        invalid(
          "NATS_URL",
          `must be a server URL or a comma-separated list of them, got ${JSON.stringify(redactUrls(servers.join(",")))}`
        )
      )

/** Refuses combinations that cannot mean one thing: two ways to authenticate, half a pair. */
const checkCombination = (
  settings: NatsConnectionSettings
): Effect.Effect<NatsConnectionSettings, SettingsInvalid> => {
  if (settings.user !== undefined && settings.password === undefined)
    return Effect.fail(invalid("NATS_PASSWORD", "is required with NATS_USER"))
  if (settings.password !== undefined && settings.user === undefined)
    return Effect.fail(invalid("NATS_USER", "is required with NATS_PASSWORD"))
  if ((settings.certFile === undefined) !== (settings.keyFile === undefined))
    return Effect.fail(
      invalid(
        settings.certFile === undefined ? "NATS_CERT" : "NATS_KEY",
        "NATS_CERT and NATS_KEY go together"
      )
    )
  const ways = [
    settings.user === undefined ? undefined : "NATS_USER/NATS_PASSWORD",
    settings.token === undefined ? undefined : "NATS_TOKEN",
    settings.credsFile === undefined ? undefined : "NATS_CREDS",
    settings.nkeyFile === undefined ? undefined : "NATS_NKEY"
  ].filter((way) => way !== undefined)
  if (ways.length > 1)
    return Effect.fail(invalid(ways[1]!, `give one way to authenticate, not ${ways.join(" and ")}`))
  return Effect.succeed(settings)
}

/** Reads NATS_URL and the authentication and TLS variables; files are not read yet. */
export const readNatsConnectionSettings = (
  env: Environment
): Effect.Effect<NatsConnectionSettings, SettingsInvalid> =>
  Effect.gen(function* () {
    const servers = yield* checkServers(
      (valueOf(env, "NATS_URL") ?? natsUrlDefault).split(",").map((server) => server.trim())
    )
    const settings: Record<string, unknown> = { servers }
    for (const [key, variable] of Object.entries(variables)) {
      if (key === "servers") continue
      const value = valueOf(env, variable)
      if (value !== undefined) settings[key] = value
    }
    return yield* checkCombination(settings as unknown as NatsConnectionSettings)
  })

/** The same checks for settings given as options (QuotaClient.connect). */
export const checkNatsConnectionSettings = (
  settings: NatsConnectionSettings
): Effect.Effect<NatsConnectionSettings, SettingsInvalid> =>
  Effect.andThen(checkServers(settings.servers), () => checkCombination(settings))

/** Reads a file a variable names: its contents, or an error naming the variable and the path. */
const readNamedFile = (variable: string, path: string): Effect.Effect<Buffer, SettingsInvalid> =>
  Effect.tryPromise({
    try: () => readFile(path),
    catch: (cause) => {
      const code = (cause as { code?: unknown }).code
      const why =
        code === "ENOENT"
          ? "no such file"
          : code === "EACCES"
            ? "permission denied"
            : code === "EISDIR"
              ? "is a directory"
              : cause instanceof Error
                ? cause.message
                : String(cause)
      return invalid(variable, `cannot read ${path}: ${why}`)
    }
  })

/**
 * An authenticator tried once on a made-up nonce: the client's own parser of the creds or seed runs
 * now, so a file that is not what its variable says fails at startup, not at the first connect.
 */
const checkedAuthenticator = (
  variable: string,
  path: string,
  what: string,
  authenticator: Authenticator
): Effect.Effect<Authenticator, SettingsInvalid> =>
  Effect.try({
    try: () => {
      authenticator("bm9uY2U")
      return authenticator
    },
    catch: (cause) =>
      invalid(
        variable,
        `${path} is not ${what}: ${cause instanceof Error ? cause.message.split("\n", 1)[0] : "unreadable"}`
      )
  })

/**
 * The nats.js options for `settings`: servers, one authenticator, TLS. Reads the files now; fails
 * naming the variable and path of a missing, unreadable or malformed one.
 */
export const connectionOptions = (
  settings: NatsConnectionSettings
): Effect.Effect<ConnectionOptions, SettingsInvalid> =>
  Effect.gen(function* () {
    let authenticator: Authenticator | undefined
    // nats.js reads no credentials from a URL; the nats CLI does (nats://user:pass@host, nats://token@host).
    const fromUrl = urlCredentials(settings.servers)
    if (settings.user !== undefined && settings.password !== undefined)
      authenticator = usernamePasswordAuthenticator(settings.user, settings.password)
    else if (settings.token !== undefined) authenticator = tokenAuthenticator(settings.token)
    else if (settings.credsFile !== undefined) {
      const creds = yield* readNamedFile("NATS_CREDS", settings.credsFile)
      authenticator = yield* checkedAuthenticator(
        "NATS_CREDS",
        settings.credsFile,
        "a .creds file (a user JWT and an nkey seed)",
        credsAuthenticator(new Uint8Array(creds))
      )
    } else if (settings.nkeyFile !== undefined) {
      const seed = (yield* readNamedFile("NATS_NKEY", settings.nkeyFile)).toString("utf8").trim()
      authenticator = yield* checkedAuthenticator(
        "NATS_NKEY",
        settings.nkeyFile,
        "an nkey seed file",
        nkeyAuthenticator(new TextEncoder().encode(seed))
      )
    } else if (fromUrl !== undefined)
      authenticator =
        fromUrl.password === undefined
          ? tokenAuthenticator(fromUrl.user)
          : usernamePasswordAuthenticator(fromUrl.user, fromUrl.password)
    const wantsTls =
      settings.caFile !== undefined ||
      settings.certFile !== undefined ||
      settings.servers.some((server) => server.toLowerCase().startsWith("tls://"))
    const tls: NonNullable<ConnectionOptions["tls"]> = {}
    if (settings.caFile !== undefined) tls.ca = (yield* readNamedFile("NATS_CA", settings.caFile)).toString()
    if (settings.certFile !== undefined && settings.keyFile !== undefined) {
      tls.cert = (yield* readNamedFile("NATS_CERT", settings.certFile)).toString()
      tls.key = (yield* readNamedFile("NATS_KEY", settings.keyFile)).toString()
    }
    return {
      servers: settings.servers.map(withoutCredentials),
      ...(authenticator === undefined ? {} : { authenticator }),
      ...(wantsTls ? { tls } : {})
    }
  })

const userInfoPattern = /^([a-z][a-z0-9+.-]*:\/\/)([^@/?#]*)@/i

/** The credentials of the first server URL that carries some: a user and password, or a token. */
const urlCredentials = (
  servers: ReadonlyArray<string>
): { readonly user: string; readonly password?: string } | undefined => {
  for (const server of servers) {
    const userInfo = userInfoPattern.exec(server)?.[2]
    if (userInfo === undefined || userInfo === "") continue
    const colon = userInfo.indexOf(":")
    return colon < 0
      ? { user: decodeURIComponent(userInfo) }
      : {
          user: decodeURIComponent(userInfo.slice(0, colon)),
          password: decodeURIComponent(userInfo.slice(colon + 1))
        }
  }
  return undefined
}

/** A server URL as given to nats.js: its credentials go to the authenticator instead. */
const withoutCredentials = (server: string): string => server.replace(userInfoPattern, "$1")

/** What logs may say of a connection: redacted servers, how it authenticates, which files. Never a secret. */
export const describeConnection = (settings: NatsConnectionSettings): Record<string, string> => ({
  servers: settings.servers.map(redactUrl).join(","),
  auth:
    settings.user !== undefined
      ? `user ${settings.user} with a password`
      : settings.token !== undefined
        ? "token"
        : settings.credsFile !== undefined
          ? `creds file ${settings.credsFile}`
          : settings.nkeyFile !== undefined
            ? `nkey seed file ${settings.nkeyFile}`
            : settings.servers.some((server) => /^[a-z]+:\/\/[^/]*@/i.test(server))
              ? "credentials in NATS_URL"
              : "none",
  tls:
    settings.caFile === undefined && settings.certFile === undefined
      ? settings.servers.some((server) => server.toLowerCase().startsWith("tls://"))
        ? "required (system CAs)"
        : "as the server asks"
      : [
          settings.caFile === undefined ? undefined : `CA ${settings.caFile}`,
          settings.certFile === undefined ? undefined : `client certificate ${settings.certFile}`
        ]
          .filter((part) => part !== undefined)
          .join(", ")
})

/** Every secret value in the settings (and in their URLs), for scrubbing a message that might hold one. */
export const secretsOf = (settings: NatsConnectionSettings): ReadonlyArray<string> => {
  const secrets: Array<string> = []
  if (settings.password !== undefined) secrets.push(settings.password)
  if (settings.token !== undefined) secrets.push(settings.token)
  for (const server of settings.servers) {
    const userInfo = /^[a-z][a-z0-9+.-]*:\/\/([^@/?#]*)@/i.exec(server)?.[1]
    if (userInfo === undefined) continue
    const colon = userInfo.indexOf(":")
    secrets.push(colon < 0 ? userInfo : userInfo.slice(colon + 1))
  }
  return secrets.filter((secret) => secret.length > 0)
}

/** `text` with every occurrence of each secret replaced by `***`. */
export const scrubSecrets = (text: string, secrets: ReadonlyArray<string>): string =>
  secrets.reduce((scrubbed, secret) => scrubbed.split(secret).join("***"), text)

export { variables as natsConnectionVariables }
