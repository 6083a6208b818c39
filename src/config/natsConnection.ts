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
 * A server URL cut into its scheme (with `://`, or "" when it has none: nats.js takes `host:port`), the
 * user part before its `@` (undefined when there is none) and the rest (host, port, path, query).
 *
 * The user part ends at the LAST `@`: a password is the operator's to spell, raw `/`, `?`, `#` and `@`
 * included, and a pattern that stopped at any of them left the password, or its tail, in what was
 * logged. An `@` after the host (in a query) makes the host count as user part too: what is hidden
 * then is more than the secret, never less.
 */
export interface UrlParts {
  readonly scheme: string
  readonly userInfo: string | undefined
  readonly rest: string
}

const schemePattern = /^[a-z][a-z0-9+.-]*:\/\//i

export const splitUrl = (url: string): UrlParts => {
  const scheme = schemePattern.exec(url)?.[0] ?? ""
  const afterScheme = url.slice(scheme.length)
  const at = afterScheme.lastIndexOf("@")
  return at < 0
    ? { scheme, userInfo: undefined, rest: afterScheme }
    : { scheme, userInfo: afterScheme.slice(0, at), rest: afterScheme.slice(at + 1) }
}

/** Whether a user part without `:` is a secret (a NATS token) rather than a database user's name. */
const tokenScheme = (scheme: string): boolean => scheme === "" || /^(nats|tls|wss?):/i.test(scheme)

/**
 * A URL with its password (or a token in the user part) replaced by `***`, and `password=` query
 * parameters too: what logs and errors show of NATS_URL and DATABASE_URL. Only the user name before
 * the first `:` is kept (it names who connects and is no secret); whatever follows is never shown,
 * however it is spelled.
 */
export const redactUrl = (url: string): string => {
  const { scheme, userInfo, rest } = splitUrl(url)
  const hidden = rest.replace(/([?&](?:password|pass|token)=)[^&#]*/gi, "$1***")
  if (userInfo === undefined) return `${scheme}${hidden}`
  const colon = userInfo.indexOf(":")
  // No colon: the user part is a token (nats://token@host) or a bare user name of a database URL.
  if (colon < 0) return tokenScheme(scheme) ? `${scheme}***@${hidden}` : `${scheme}${userInfo}@${hidden}`
  return `${scheme}${userInfo.slice(0, colon)}:***@${hidden}`
}

/** Several URLs, comma-separated, each redacted. */
export const redactUrls = (urls: string): string =>
  urls
    .split(",")
    .map((url) => redactUrl(url.trim()))
    .join(",")

/** The credentials in a server URL, percent-decoded: a user and password, or a token. */
interface UrlCredentials {
  readonly user: string
  readonly password?: string
}

/** Decodes `%XX` escapes; undefined when one is malformed (a `%` not followed by two hex digits). */
const percentDecoded = (text: string): string | undefined => {
  try {
    return decodeURIComponent(text)
  } catch {
    return undefined
  }
}

/**
 * The credentials in `server`, or the reason they cannot be read. The reason names the server by its
 * position and never quotes the user part, which holds the secret.
 */
const credentialsIn = (
  server: string,
  position: number
): UrlCredentials | undefined | { readonly malformed: string } => {
  const { userInfo } = splitUrl(server)
  if (userInfo === undefined || userInfo === "") return undefined
  const colon = userInfo.indexOf(":")
  const user = percentDecoded(colon < 0 ? userInfo : userInfo.slice(0, colon))
  const password = colon < 0 ? undefined : percentDecoded(userInfo.slice(colon + 1))
  if (user === undefined || (colon >= 0 && password === undefined))
    return {
      malformed:
        `the credentials of server ${position} are not valid percent-encoding ` +
        "(a % must be followed by two hex digits: write a literal % as %25)"
    }
  return password === undefined ? { user } : { user, password }
}

const valueOf = (env: Environment, variable: string): string | undefined => {
  const value = env[variable]
  return value === undefined || value.trim() === "" ? undefined : value.trim()
}

const checkServers = (
  servers: ReadonlyArray<string>
): Effect.Effect<ReadonlyArray<string>, SettingsInvalid> => {
  if (servers.length === 0 || !servers.every((server) => server !== "" && !/\s/.test(server)))
    return Effect.fail(
      invalid(
        "NATS_URL",
        `must be a server URL or a comma-separated list of them, got ${JSON.stringify(redactUrls(servers.join(",")))}`
      )
    )
  for (const [index, server] of servers.entries()) {
    const credentials = credentialsIn(server, index + 1)
    if (credentials !== undefined && "malformed" in credentials)
      return Effect.fail(invalid("NATS_URL", credentials.malformed))
  }
  return Effect.succeed(servers)
}

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
    const fromUrl = yield* urlCredentials(settings.servers)
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

/**
 * The credentials of the first server URL that carries some: a user and password, or a token. A
 * malformed `%` escape is a settings error naming NATS_URL (it used to escape as a defect).
 */
const urlCredentials = (
  servers: ReadonlyArray<string>
): Effect.Effect<UrlCredentials | undefined, SettingsInvalid> => {
  for (const [index, server] of servers.entries()) {
    const credentials = credentialsIn(server, index + 1)
    if (credentials === undefined) continue
    return "malformed" in credentials
      ? Effect.fail(invalid("NATS_URL", credentials.malformed))
      : Effect.succeed(credentials)
  }
  return Effect.succeed(undefined)
}

/** A server URL as given to nats.js: its credentials go to the authenticator instead. */
const withoutCredentials = (server: string): string => {
  const { scheme, rest } = splitUrl(server)
  return `${scheme}${rest}`
}

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
            : settings.servers.some((server) => (splitUrl(server).userInfo ?? "") !== "")
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

/**
 * Every secret value in the settings (and in their URLs, as written and percent-decoded), for
 * scrubbing a message that might hold one.
 */
export const secretsOf = (settings: NatsConnectionSettings): ReadonlyArray<string> => {
  const secrets: Array<string> = []
  if (settings.password !== undefined) secrets.push(settings.password)
  if (settings.token !== undefined) secrets.push(settings.token)
  for (const server of settings.servers) {
    const { userInfo } = splitUrl(server)
    if (userInfo === undefined) continue
    const colon = userInfo.indexOf(":")
    const secret = colon < 0 ? userInfo : userInfo.slice(colon + 1)
    secrets.push(secret)
    const decoded = percentDecoded(secret)
    if (decoded !== undefined && decoded !== secret) secrets.push(decoded)
  }
  // Longest first: a secret that contains another is replaced whole, not around the shorter one.
  return secrets.filter((secret) => secret.length > 0).sort((left, right) => right.length - left.length)
}

/** `text` with every occurrence of each secret replaced by `***`. */
export const scrubSecrets = (text: string, secrets: ReadonlyArray<string>): string =>
  secrets.reduce((scrubbed, secret) => scrubbed.split(secret).join("***"), text)

export { variables as natsConnectionVariables }
