/**
 * src/config/natsConnection.ts: the NATS_* variables as the `nats` CLI reads them, refusals naming the
 * variable (and the path of a file), the client's own authenticators and TLS options, and redaction:
 * what logs may say never holds a secret.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { createUser } from "@nats-io/nkeys"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { Environment } from "../../src/config/SettingsInvalid.js"
import { SettingsInvalid } from "../../src/config/SettingsInvalid.js"
import {
  connectionOptions,
  describeConnection,
  readNatsConnectionSettings,
  redactUrl,
  scrubSecrets,
  secretsOf
} from "../../src/config/natsConnection.js"

const read = (env: Environment) => Effect.runPromise(readNatsConnectionSettings(env))
const refusal = (env: Environment) => Effect.runPromise(Effect.flip(readNatsConnectionSettings(env)))
const options = (env: Environment) =>
  Effect.runPromise(Effect.flatMap(readNatsConnectionSettings(env), connectionOptions))
/** The one authenticator the options carry, called as the client calls it on a server's nonce. */
const authenticate = async (env: Environment, nonce?: string) => {
  const { authenticator } = await options(env)
  if (typeof authenticator !== "function")
    throw new Error(`expected one authenticator, got ${typeof authenticator}`)
  return authenticator(nonce)
}
const optionsRefusal = (env: Environment) =>
  Effect.runPromise(Effect.flip(Effect.flatMap(readNatsConnectionSettings(env), connectionOptions)))

let dir: string
let seedFile: string
let seed: string
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "nats-connection-"))
  seed = new TextDecoder().decode(createUser().getSeed())
  seedFile = join(dir, "user.nk")
  await writeFile(seedFile, `${seed}\n`)
  await writeFile(join(dir, "garbage.creds"), "not a creds file\n")
  await writeFile(join(dir, "garbage.nk"), "SUNOTASEED\n")
  await writeFile(join(dir, "ca.pem"), "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
})
afterAll(() => rm(dir, { recursive: true, force: true }))

describe("readNatsConnectionSettings", () => {
  it("defaults to nats://127.0.0.1:4222 with no authentication", async () => {
    expect(await read({})).toEqual({ servers: ["nats://127.0.0.1:4222"] })
  })

  it("reads every variable", async () => {
    expect(
      await read({
        NATS_URL: "tls://a:4222, tls://b:4222",
        NATS_CREDS: "/etc/quota/coordinator.creds",
        NATS_CA: "/etc/quota/ca.pem",
        NATS_CERT: "/etc/quota/client.pem",
        NATS_KEY: "/etc/quota/client-key.pem"
      })
    ).toEqual({
      servers: ["tls://a:4222", "tls://b:4222"],
      credsFile: "/etc/quota/coordinator.creds",
      caFile: "/etc/quota/ca.pem",
      certFile: "/etc/quota/client.pem",
      keyFile: "/etc/quota/client-key.pem"
    })
    expect(await read({ NATS_USER: "svc", NATS_PASSWORD: "pw" })).toMatchObject({
      user: "svc",
      password: "pw"
    })
    expect(await read({ NATS_TOKEN: "t0k3n" })).toMatchObject({ token: "t0k3n" })
    expect(await read({ NATS_NKEY: "/etc/quota/user.nk" })).toMatchObject({ nkeyFile: "/etc/quota/user.nk" })
  })

  it.each([
    [{ NATS_USER: "svc" }, "NATS_PASSWORD", "is required with NATS_USER"],
    [{ NATS_PASSWORD: "pw" }, "NATS_USER", "is required with NATS_PASSWORD"],
    [{ NATS_CERT: "/c.pem" }, "NATS_KEY", "NATS_CERT and NATS_KEY go together"],
    [{ NATS_KEY: "/k.pem" }, "NATS_CERT", "NATS_CERT and NATS_KEY go together"],
    [{ NATS_TOKEN: "t", NATS_CREDS: "/c.creds" }, "NATS_CREDS", "give one way to authenticate"],
    [{ NATS_USER: "u", NATS_PASSWORD: "p", NATS_NKEY: "/n" }, "NATS_NKEY", "give one way to authenticate"],
    [{ NATS_URL: "nats://a:4222,,nats://b" }, "NATS_URL", "must be a server URL"]
  ])("refuses %j naming %s", async (env, variable, reason) => {
    const error = await refusal(env)
    expect(error._tag).toBe("SettingsInvalid")
    expect(error.variable).toBe(variable)
    expect(error.message).toContain(reason)
  })

  it("does not repeat a password from NATS_URL in its refusal", async () => {
    const error = await refusal({ NATS_URL: "nats://svc:hunter2@a:4222, nats://b c" })
    expect(error.message).not.toContain("hunter2")
    expect(error.message).toContain("nats://svc:***@a:4222")
  })
})

describe("connectionOptions", () => {
  it("uses the client's authenticators and asks for TLS for tls:// or a CA", async () => {
    expect(await options({})).toEqual({ servers: ["nats://127.0.0.1:4222"] })
    expect(await authenticate({ NATS_USER: "svc", NATS_PASSWORD: "pw" })).toEqual({ user: "svc", pass: "pw" })
    expect(await authenticate({ NATS_TOKEN: "t0k3n" })).toEqual({ auth_token: "t0k3n" })
    expect(await authenticate({ NATS_NKEY: seedFile }, "bm9uY2U")).toMatchObject({
      nkey: expect.stringMatching(/^U/) as string
    })
    expect((await options({ NATS_URL: "tls://a:4222" })).tls).toEqual({})
    // As the nats CLI: credentials in the URL (percent-decoded), given to nats.js as an authenticator.
    expect(await authenticate({ NATS_URL: "nats://svc:p%40ss@a:4222" })).toEqual({
      user: "svc",
      pass: "p@ss"
    })
    expect(await authenticate({ NATS_URL: "nats://s3cr3t@a:4222" })).toEqual({ auth_token: "s3cr3t" })
    expect((await options({ NATS_URL: "nats://svc:pw@a:4222,nats://b:4222" })).servers).toEqual([
      "nats://a:4222",
      "nats://b:4222"
    ])
    // Explicit variables win over the URL's.
    expect(await authenticate({ NATS_URL: "nats://svc:pw@a:4222", NATS_TOKEN: "t" })).toEqual({
      auth_token: "t"
    })
    expect((await options({ NATS_CA: join(dir, "ca.pem") })).tls?.ca).toContain("BEGIN CERTIFICATE")
  })

  it.each([
    ["NATS_CREDS", "missing.creds", "cannot read", "no such file"],
    ["NATS_NKEY", "missing.nk", "cannot read", "no such file"],
    ["NATS_CA", "missing.pem", "cannot read", "no such file"],
    ["NATS_CREDS", "garbage.creds", "is not a .creds file", ""],
    ["NATS_NKEY", "garbage.nk", "is not an nkey seed file", ""]
  ])("refuses %s=%s naming the variable and the path", async (variable, file, reason, why) => {
    const path = join(dir, file)
    const error = await optionsRefusal({ [variable]: path })
    expect(error.variable).toBe(variable)
    expect(error.message).toContain(`${variable}: `)
    expect(error.message).toContain(path)
    expect(error.message).toContain(reason)
    expect(error.message).toContain(why)
  })

  it("refuses a directory where a file is named", async () => {
    expect((await optionsRefusal({ NATS_CA: dir })).message).toBe(
      `NATS_CA: cannot read ${dir}: is a directory`
    )
  })
})

describe("redaction", () => {
  it.each([
    ["nats://svc:hunter2@a:4222", "nats://svc:***@a:4222"],
    ["nats://s3cr3t-token@a:4222", "nats://***@a:4222"],
    ["tls://a:4222", "tls://a:4222"],
    ["postgres://quota:pa55@db:5432/quota", "postgres://quota:***@db:5432/quota"],
    [
      "postgres://quota@db/quota?password=pa55&sslmode=require",
      "postgres://quota@db/quota?password=***&sslmode=require"
    ],
    ["postgres://db/quota", "postgres://db/quota"],
    // However the password is spelled: raw /, ?, #, @ and % are the operator's to use.
    ["nats://user:pa/ss@a:4222", "nats://user:***@a:4222"],
    ["nats://user:p@ss@a:4222", "nats://user:***@a:4222"],
    ["nats://user:p?a#s@a:4222", "nats://user:***@a:4222"],
    ["nats://user:100%zz@a:4222", "nats://user:***@a:4222"],
    ["nats://to/k@en@a:4222", "nats://***@a:4222"],
    ["user:pa/ss@a:4222", "user:***@a:4222"],
    ["postgres://quota:pa/ss@db:5432/quota", "postgres://quota:***@db:5432/quota"]
  ])("redactUrl(%s) is %s", (url, redacted) => {
    expect(redactUrl(url)).toBe(redacted)
  })

  it("describes a connection without its secrets, and knows them to scrub", async () => {
    const env = { NATS_URL: "nats://a:pw-in-url@h:4222", NATS_USER: "svc", NATS_PASSWORD: "hunter2" }
    const settings = await read(env)
    const described = JSON.stringify(describeConnection(settings))
    expect(described).not.toContain("hunter2")
    expect(described).not.toContain("pw-in-url")
    expect(described).toContain("user svc with a password")
    expect(scrubSecrets("failed with hunter2 at pw-in-url", secretsOf(settings))).toBe(
      "failed with *** at ***"
    )
    const withToken = describeConnection(await read({ NATS_TOKEN: "t0k3n" }))
    expect(JSON.stringify(withToken)).not.toContain("t0k3n")
    expect(JSON.stringify(describeConnection(await read({ NATS_NKEY: seedFile })))).not.toContain(seed)
  })

  it("takes the user part up to the last @, whatever the password holds, and scrubs it whole", async () => {
    const env = { NATS_URL: "nats://a:p@ss/w?r#d@h:4222,nats://b:x%40y@h:4223" }
    const settings = await read(env)
    expect(describeConnection(settings)).toMatchObject({
      servers: "nats://a:***@h:4222,nats://b:***@h:4223",
      auth: "credentials in NATS_URL"
    })
    expect(scrubSecrets("p@ss/w?r#d, x%40y and x@y", secretsOf(settings))).toBe("***, *** and ***")
    expect(await authenticate(env)).toEqual({ user: "a", pass: "p@ss/w?r#d" })
    expect((await options(env)).servers).toEqual(["nats://h:4222", "nats://h:4223"])
  })

  it("a malformed % escape in NATS_URL is a settings error naming it, without the secret", async () => {
    const error = await refusal({ NATS_URL: "nats://127.0.0.1:4222,nats://svc:100%zz-secret@h:4222" })
    expect(error).toBeInstanceOf(SettingsInvalid)
    expect(error.message).toBe(
      "NATS_URL: the credentials of server 2 are not valid percent-encoding (a % must be followed by two hex digits: write a literal % as %25)"
    )
    expect(error.message).not.toContain("secret")
  })
})
