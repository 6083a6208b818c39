/**
 * Passwords in NATS_URL spelled with what a URL uses as delimiters (`/`, `?`, `#`, `@`) or with a
 * malformed `%` escape, through the real code paths: a compiled `serve` process with its logs at debug,
 * and the operator's command line, against a nats-server that requires exactly those passwords. Each
 * connects as the user it names (the user part ends at the last `@`), a malformed escape is a settings
 * error naming NATS_URL, and no output holds any password or a piece of one.
 */
import { randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { NatsServerProcess } from "../support/natsServerProcess.js"
import { startNatsServer } from "../support/natsServerProcess.js"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import { createTestDatabase, randomPrefix, startServe } from "../support/processes.js"
import type { CliRun } from "./support.js"
import { exitCodeWithin, logLines, runCommandLine, stop, whenReady } from "./support.js"

/** In every password and nowhere else: finding it anywhere in the output is a leak. */
const tag = randomBytes(10).toString("hex")
const passwords = {
  slash: `pa/ss${tag}s`,
  at: `p@ss${tag}a`,
  query: `p?a#ss${tag}q`
}
const prefix = randomPrefix("urlpw")
const partitions = 4

let dir: string
let server: NatsServerProcess
let database: TestDatabase
const serves: Array<ServeProcess> = []
/** Every output of the runs, searched by the last test. */
const outputs: Array<{ readonly name: string; readonly text: () => string }> = []

const at = (user: string, password: string) => `nats://${user}:${password}@127.0.0.1:${server.port}`

const serveEnv = (natsUrl: string): Record<string, string> => ({
  ...Object.fromEntries(
    ["USER", "PASSWORD", "TOKEN", "CREDS", "NKEY", "CA", "CERT", "KEY"].map((name) => [`NATS_${name}`, ""])
  ),
  DATABASE_URL: database.url,
  NATS_URL: natsUrl,
  QUOTA_PREFIX: prefix,
  QUOTA_PARTITIONS: String(partitions),
  QUOTA_LEASE_MS: "2000",
  LOG_LEVEL: "debug"
})

const launch = (name: string, natsUrl: string): ServeProcess => {
  const serve = startServe(serveEnv(natsUrl))
  serves.push(serve)
  outputs.push({ name: `serve (${name})`, text: serve.output })
  return serve
}

const cli = async (name: string, args: ReadonlyArray<string>, natsUrl: string): Promise<CliRun> => {
  const ran = await runCommandLine(args, {
    QUOTA_PREFIX: prefix,
    QUOTA_PARTITIONS: String(partitions),
    NATS_URL: natsUrl
  })
  outputs.push({ name: `cli ${name}`, text: () => `${ran.stdout}\n${ran.stderr}` })
  return ran
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "qc-url-passwords-"))
  database = await createTestDatabase("urlpw")
  const users = Object.entries(passwords)
    .map(([user, password]) => `{ user: ${user}, password: ${JSON.stringify(password)} }`)
    .join(", ")
  server = await startNatsServer(
    join(dir, "nats"),
    (port) =>
      `listen: 127.0.0.1:${port}\njetstream { store_dir: "${join(dir, "js")}" }\n` +
      `authorization { users = [ ${users} ] }\n`
  )
}, 60_000)

afterAll(async () => {
  await Promise.allSettled(serves.map((serve) => stop(serve)))
  await server?.stop()
  await database?.drop()
  if (dir !== undefined) await rm(dir, { recursive: true, force: true })
}, 60_000)

describe("a password in NATS_URL, however it is spelled", () => {
  it("serve connects as the user it names and logs the servers with the passwords hidden", async () => {
    const servers = [at("at", passwords.at), at("slash", passwords.slash), at("query", passwords.query)]
    const serve = launch("three spellings", servers.join(","))
    await whenReady("three spellings", serve)
    const serving = logLines(serve.output(), "serving")
    expect(serving, serve.output()).toHaveLength(1)
    expect(serving[0]!["nats"]).toEqual({
      servers: ["at", "slash", "query"]
        .map((user) => `nats://${user}:***@127.0.0.1:${server.port}`)
        .join(","),
      auth: "credentials in NATS_URL",
      tls: "as the server asks"
    })
  })

  it("the command line connects with each spelling, and a wrong one is refused without its text", async () => {
    for (const [user, password] of Object.entries(passwords)) {
      const ran = await cli(`usage as ${user}`, ["usage", "someone"], at(user, password))
      expect(ran.code, ran.stderr).toBe(0)
      expect(ran.stdout).toContain('user "someone", plan free')
    }
    const wrong = await cli("wrong password", ["usage", "someone"], at("at", `wr@ng/${tag}w`))
    expect(wrong.code).toBe(2)
    expect(wrong.stderr).toContain(`cannot connect to NATS at nats://at:***@127.0.0.1:${server.port}`)
  })

  it("a malformed % escape is a settings error naming NATS_URL, for serve and the command line", async () => {
    const malformed = at("slash", `100%zz${tag}m`)
    const ran = await cli("malformed escape", ["usage", "someone"], malformed)
    expect(ran.code).toBe(2)
    expect(ran.stderr).toContain(
      "NATS_URL: the credentials of server 1 are not valid percent-encoding (a % must be followed by two hex digits: write a literal % as %25)"
    )
    const serve = launch("malformed escape", malformed)
    expect(await exitCodeWithin("malformed escape", serve, 30_000)).not.toBe(0)
    expect(serve.output()).toContain("NATS_URL: the credentials of server 1 are not valid percent-encoding")
    expect(serve.output()).not.toMatch(/URIError|URI malformed|defect/i)
  })

  it("appear in no output, whole or in part", async () => {
    await Promise.all(serves.map((serve) => stop(serve)))
    expect(outputs.length).toBeGreaterThanOrEqual(3)
    const leaks = outputs.filter((output) => output.text().includes(tag)).map((output) => output.name)
    expect(leaks).toEqual([])
  })
})
