/**
 * A secured deployment end to end (PROTOCOL.md "Connecting and permissions"): nats-server processes of
 * this file on free loopback ports, each with a generated config (user/password over TLS in the
 * permission layout of deploy/nats, nkeys, operator/account/user JWTs, mutual TLS, a token, credentials
 * inside NATS_URL) and certificates made now; a `serve` child process on each, on a fresh database;
 * the client and the command line in this process. The last test searches everything every run
 * printed, the failed runs included, for every secret used.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { errors } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { QuotaTransportError } from "../../src/client/errors.js"
import { QuotaClient } from "../../src/client/QuotaClient.js"
import type { QuotaClientConnectOptions } from "../../src/client/QuotaClient.js"
import { NatsConnectFailed } from "../../src/transport/errors.js"
import {
  makeCertificates,
  makeDecentralizedAuth,
  newNkeyUser,
  startNatsServer
} from "../support/natsServerProcess.js"
import type { NatsServerProcess, TestCertificates } from "../support/natsServerProcess.js"
import { createTestDatabase, randomPrefix, startServe } from "../support/processes.js"
import type { ServeProcess, TestDatabase } from "../support/processes.js"
import type { CliRun } from "./support.js"
import {
  credsSeed,
  deployLayoutFor,
  exitCodeWithin,
  logLines,
  runCommandLine,
  secret,
  stop,
  tlsBlock,
  whenReady,
  withPassword
} from "./support.js"

const prefix = randomPrefix("sec")
const partitions = 8
const passwords = {
  coordinator: secret("CoordinatorPw"),
  service: secret("ServicePw"),
  operator: secret("OperatorPw"),
  wrong: secret("WrongPw"),
  inNatsUrl: secret("NatsUrlPw"),
  inDatabaseUrl: secret("DatabasePw")
}
const token = secret("Token")
const nkeys = { coordinator: newNkeyUser(), client: newNkeyUser() }
/** Every secret of this file by name; beforeAll adds the seeds of the .creds files. */
const secrets: Record<string, string> = {
  ...Object.fromEntries(Object.entries(passwords).map(([name, value]) => [`password ${name}`, value])),
  token,
  "nkey seed of the coordinator": nkeys.coordinator.seed,
  "nkey seed of the client": nkeys.client.seed
}

type Setup = "tls" | "nkey" | "jwt" | "mtls" | "token" | "url"
const servers = {} as Record<Setup, NatsServerProcess>
const serves: Partial<Record<Setup | "wrong", ServeProcess>> = {}
const databases = {} as Record<Setup | "wrong", TestDatabase>
const clients: Array<QuotaClient> = []
/** What every process and command line printed and every error message, for the last test. */
const outputs: Array<{ readonly name: string; readonly text: () => string }> = []
const files = {} as Record<"coordinatorSeed" | "clientSeed" | "coordinatorCreds" | "serviceCreds", string>
let dir: string
let certs: TestCertificates

const url = (setup: Setup) =>
  `${setup === "tls" || setup === "mtls" ? "tls" : "nats"}://127.0.0.1:${servers[setup].port}`
const urlWithCredentials = () => `nats://quota-url:${passwords.inNatsUrl}@127.0.0.1:${servers.url.port}`

/** A serve's environment: its database (with a password in the URL), `nats`, every other NATS_* blanked. */
const serveEnv = (database: TestDatabase, nats: Record<string, string>): Record<string, string> => ({
  ...Object.fromEntries(
    ["USER", "PASSWORD", "TOKEN", "CREDS", "NKEY", "CA", "CERT", "KEY"].map((name) => [`NATS_${name}`, ""])
  ),
  DATABASE_URL: withPassword(database.url, passwords.inDatabaseUrl),
  QUOTA_PREFIX: prefix,
  QUOTA_PARTITIONS: String(partitions),
  QUOTA_LEASE_MS: "2000",
  ...nats
})

const launch = (name: Setup | "wrong", env: Record<string, string>): ServeProcess => {
  const serve = startServe(serveEnv(databases[name], env))
  serves[name] = serve
  outputs.push({ name: `serve (${name})`, text: serve.output })
  return serve
}

const connectClient = async (options: QuotaClientConnectOptions): Promise<QuotaClient> => {
  const client = await QuotaClient.connect({ prefix, partitions, timeoutMs: 5_000, ...options })
  clients.push(client)
  return client
}

/** The error `QuotaClient.connect` rejects with (kept for the last test) and how long it took. */
const connectFailure = async (name: string, options: QuotaClientConnectOptions) => {
  const started = Date.now()
  const error = await connectClient(options).then(
    () => new Error(`${name}: connected`),
    (error: unknown) => error as Error
  )
  outputs.push({ name: `client error (${name})`, text: () => `${error.message}\n${String(error.cause)}` })
  return { error, ms: Date.now() - started }
}

const cli = async (
  name: string,
  args: ReadonlyArray<string>,
  env: Record<string, string>
): Promise<CliRun> => {
  const ran = await runCommandLine(args, {
    QUOTA_PREFIX: prefix,
    QUOTA_PARTITIONS: String(partitions),
    NATS_URL: url("tls"),
    NATS_CA: certs.caFile,
    ...env
  })
  outputs.push({ name: `cli ${name}: ${args.join(" ")}`, text: () => `${ran.stdout}\n${ran.stderr}` })
  return ran
}

const asOperator = { NATS_USER: "quota-operator", NATS_PASSWORD: passwords.operator }
const asService = { NATS_USER: "quota-service", NATS_PASSWORD: passwords.service }

/** The `nats` field of the one "serving" line a serve process logged. */
const servingLine = (setup: Setup): unknown => {
  const lines = logLines(serves[setup]!.output(), "serving")
  expect(lines, serves[setup]!.output()).toHaveLength(1)
  return lines[0]!["nats"]
}

const reserves = async (client: QuotaClient, user: string) =>
  expect((await client.reserve({ user, meter: "tokens", amount: 5, id: `job-${user}` })).status).toBe(
    "reserved"
  )

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "qc-secured-"))
  const names = ["tls", "nkey", "jwt", "mtls", "token", "url", "wrong"] as const
  const [made, auth, layout] = await Promise.all([
    makeCertificates(join(dir, "certs")),
    makeDecentralizedAuth(),
    deployLayoutFor(prefix),
    ...names.map(async (name) => {
      databases[name] = await createTestDatabase(`sec${name}`)
    })
  ])
  certs = made
  const coordinatorCreds = await auth.userCreds("coordinator")
  const serviceCreds = await auth.userCreds("service", {
    publish: [`${prefix}.v1.*.ops`],
    subscribe: ["_INBOX.>"]
  })
  secrets["seed in the coordinator's .creds"] = credsSeed(coordinatorCreds)
  secrets["seed in the service's .creds"] = credsSeed(serviceCreds)
  const contents = {
    coordinatorSeed: `${nkeys.coordinator.seed}\n`,
    clientSeed: `${nkeys.client.seed}\n`,
    coordinatorCreds,
    serviceCreds
  }
  for (const [name, text] of Object.entries(contents)) {
    files[name as keyof typeof files] = join(dir, name)
    await writeFile(join(dir, name), text, { mode: 0o600 })
  }

  const serverTls = tlsBlock(certs.serverCertFile, certs.serverKeyFile)
  const plain = (port: number, rest: string) =>
    `listen: 127.0.0.1:${port}\njetstream { store_dir: "${join(dir, `js-${port}`)}" }\n${rest}\n`
  const configs: Record<Setup, [(port: number) => string, Record<string, string>?]> = {
    tls: [
      (port) => layout(port, dir, serverTls),
      {
        QUOTA_COORDINATOR_PASSWORD: passwords.coordinator,
        QUOTA_SERVICE_PASSWORD: passwords.service,
        QUOTA_OPERATOR_PASSWORD: passwords.operator
      }
    ],
    nkey: [
      (port) =>
        plain(
          port,
          `authorization { users = [ { nkey: ${nkeys.coordinator.publicKey} }, { nkey: ${nkeys.client.publicKey} } ] }`
        )
    ],
    jwt: [(port) => plain(port, auth.serverConfig)],
    mtls: [(port) => plain(port, tlsBlock(certs.serverCertFile, certs.serverKeyFile, certs.caFile))],
    token: [(port) => plain(port, `authorization { token: "${token}" }`)],
    url: [(port) => plain(port, `authorization { user: quota-url, password: "${passwords.inNatsUrl}" }`)]
  }
  const started = await Promise.allSettled(
    Object.entries(configs).map(async ([name, [config, env]]) => {
      servers[name as Setup] = await startNatsServer(join(dir, "nats"), config, env)
    })
  )
  for (const result of started) if (result.status === "rejected") throw result.reason

  launch("tls", {
    NATS_URL: url("tls"),
    NATS_USER: "quota-coordinator",
    NATS_PASSWORD: passwords.coordinator,
    NATS_CA: certs.caFile
  })
  launch("nkey", { NATS_URL: url("nkey"), NATS_NKEY: files.coordinatorSeed })
  launch("jwt", { NATS_URL: url("jwt"), NATS_CREDS: files.coordinatorCreds })
  launch("mtls", {
    NATS_URL: url("mtls"),
    NATS_CA: certs.caFile,
    NATS_CERT: certs.clientCertFile,
    NATS_KEY: certs.clientKeyFile
  })
  launch("token", { NATS_URL: url("token"), NATS_TOKEN: token })
  launch("url", { NATS_URL: urlWithCredentials() })
}, 60_000)

afterAll(async () => {
  await Promise.allSettled(clients.map((client) => client.close()))
  await Promise.allSettled(Object.values(serves).map((serve) => stop(serve)))
  await Promise.allSettled(Object.values(servers).map((server) => server.stop()))
  await Promise.allSettled(Object.values(databases).map((database) => database.drop()))
  if (dir !== undefined) await rm(dir, { recursive: true, force: true })
}, 60_000)

describe("user and password over TLS, in deploy/nats's permission layout", () => {
  let service: QuotaClient
  let operator: QuotaClient

  beforeAll(async () => {
    await whenReady("tls", serves.tls!)
    const tls = { servers: url("tls"), caFile: certs.caFile }
    service = await connectClient({ ...tls, user: "quota-service", password: passwords.service })
    operator = await connectClient({ ...tls, user: "quota-operator", password: passwords.operator })
  }, 60_000)

  it("serves a service's reserve, and the server refuses its set_plan at once (not retried)", async () => {
    await reserves(service, "ann")
    const started = Date.now()
    const refused = await service.setPlan({ user: "ann", plan: "pro" }).then(
      (result) => new Error(`set_plan answered ${JSON.stringify(result)}`),
      (error: unknown) => error as Error
    )
    expect(Date.now() - started).toBeLessThan(2_000)
    const admin = service.subjectOf("ann", "admin")
    expect(refused).toBeInstanceOf(QuotaTransportError)
    expect(refused).toMatchObject({ subject: admin })
    expect(refused.message).toContain(`Permissions Violation for Publish to "${admin}"`)
    expect(refused.cause).toBeInstanceOf(errors.RequestError)
    expect((refused.cause as Error).cause).toBeInstanceOf(errors.PermissionViolationError)
    outputs.push({ name: "client error (service set_plan)", text: () => refused.message })
    expect(await operator.getUsage({ user: "ann" })).toMatchObject({ status: "ok", plan: "free" })
  })

  it("lets the operator set a plan", async () => {
    expect(await operator.setPlan({ user: "bob", plan: "pro" })).toMatchObject({ status: "ok" })
    expect(await operator.getUsage({ user: "bob" })).toMatchObject({ status: "ok", plan: "pro" })
  })

  it("runs the operator's command line: set-plan, usage --json, holds", async () => {
    await reserves(service, "cid")
    const setPlan = await cli("operator", ["set-plan", "cid", "enterprise"], asOperator)
    expect(setPlan, setPlan.stderr).toMatchObject({ code: 0, stderr: "" })
    const usage = await cli("operator", ["usage", "cid", "--json"], asOperator)
    expect(usage.code, usage.stderr).toBe(0)
    expect(JSON.parse(usage.stdout)).toMatchObject({ status: "ok", plan: "enterprise" })
    const holds = await cli("operator", ["holds", "cid", "--json"], asOperator)
    expect(holds.code, holds.stderr).toBe(0)
    expect(JSON.parse(holds.stdout)).toMatchObject({ status: "ok", holds: [{ id: "job-cid" }] })
  })

  it("exits 2 when the server refuses the service's set-plan, and the plan stays", async () => {
    const refused = await cli("service", ["set-plan", "dee", "pro"], asService)
    expect(refused.code).toBe(2)
    expect(refused.stdout).toBe("")
    const admin = service.subjectOf("dee", "admin")
    // The coordinator never saw the request: to the command line a connection-level failure, naming
    // the op, the user and the subject (issue 30: every client error says what happened).
    expect(refused.stderr).toBe(
      `quota-coordinator: quota: set_plan (user "dee") on ${admin}: Permissions Violation for Publish to "${admin}"\n`
    )
    expect(await operator.getUsage({ user: "dee" })).toMatchObject({ status: "ok", plan: "free" })
  })

  it("refuses a wrong password at once, naming the server and the reason", async () => {
    const { error, ms } = await connectFailure("wrong password", {
      servers: url("tls"),
      caFile: certs.caFile,
      user: "quota-service",
      password: passwords.wrong
    })
    expect(error).toBeInstanceOf(NatsConnectFailed)
    expect(error.message).toMatch(
      new RegExp(`^cannot connect to NATS at ${url("tls")}: the server refused the credentials \\(`)
    )
    expect(ms).toBeLessThan(5_000)
    const ran = await cli("wrong password", ["usage", "ann"], {
      ...asService,
      NATS_PASSWORD: passwords.wrong
    })
    expect(ran.code).toBe(2)
    expect(ran.stderr).toBe(
      `quota-coordinator: cannot connect to NATS at ${url("tls")}: the server refused the credentials (Authorization Violation)\n`
    )
  })

  it("stops a serve whose password is wrong, saying why", async () => {
    const serve = launch("wrong", {
      NATS_URL: url("tls"),
      NATS_USER: "quota-coordinator",
      NATS_PASSWORD: passwords.wrong,
      NATS_CA: certs.caFile
    })
    const code = await exitCodeWithin("wrong password", serve, 15_000)
    expect(code, serve.output()).toBe(1)
    expect(serve.output()).toContain(
      `quota-coordinator: cannot connect to NATS at ${url("tls")}: the server refused the credentials`
    )
  })

  it("refuses a server whose certificate another CA signed: a TLS error", async () => {
    const { error } = await connectFailure("other CA", {
      servers: url("tls"),
      caFile: certs.otherCaFile,
      user: "quota-service",
      password: passwords.service
    })
    expect(error).toBeInstanceOf(NatsConnectFailed)
    expect(error.message).toMatch(new RegExp(`^cannot connect to NATS at ${url("tls")}: TLS failed: `))
    const ran = await cli("other CA", ["usage", "ann"], { ...asOperator, NATS_CA: certs.otherCaFile })
    expect(ran.code).toBe(2)
    expect(ran.stderr).toBe(
      `quota-coordinator: cannot connect to NATS at ${url("tls")}: TLS failed: unable to verify the first certificate\n`
    )
  })
})

describe("other ways to authenticate", () => {
  it("an nkey seed file (NATS_NKEY): serve and a client", async () => {
    await whenReady("nkey", serves.nkey!)
    await reserves(await connectClient({ servers: url("nkey"), nkeyFile: files.clientSeed }), "eve")
  })

  it("a .creds file of a decentralized-auth account (NATS_CREDS): serve and a client allowed .ops only", async () => {
    await whenReady("jwt", serves.jwt!)
    const client = await connectClient({ servers: url("jwt"), credsFile: files.serviceCreds })
    await reserves(client, "fay")
    await expect(client.setPlan({ user: "fay", plan: "pro" })).rejects.toThrow(/Permissions Violation/)
  })

  it("mutual TLS: serve with NATS_CERT and NATS_KEY; a client without a certificate is refused", async () => {
    await whenReady("mtls", serves.mtls!)
    // The server ends the handshake with a TLS alert; nats.js, reconnecting by default, does not report
    // it and waits out the connect timeout (20 s unless told): the reason is then only "timeout".
    const { error, ms } = await connectFailure("mtls without a certificate", {
      servers: url("mtls"),
      caFile: certs.caFile,
      connectionOptions: { timeout: 3_000 }
    })
    expect(error).toBeInstanceOf(NatsConnectFailed)
    expect(error.message).toContain(`cannot connect to NATS at ${url("mtls")}: `)
    expect(ms).toBeLessThan(10_000)
    expect(servers.mtls.output()).toContain("client didn't provide a certificate")
    const client = await connectClient({
      servers: url("mtls"),
      caFile: certs.caFile,
      certFile: certs.clientCertFile,
      keyFile: certs.clientKeyFile
    })
    await reserves(client, "gus")
  })

  it("a token (NATS_TOKEN)", async () => {
    await whenReady("token", serves.token!)
    await reserves(await connectClient({ servers: url("token"), token }), "hal")
  })

  it("a user and password inside NATS_URL; the startup line shows it redacted", async () => {
    await whenReady("url", serves.url!)
    expect(servingLine("url")).toEqual({
      servers: `nats://quota-url:***@127.0.0.1:${servers.url.port}`,
      auth: "credentials in NATS_URL",
      tls: "as the server asks"
    })
    await reserves(await connectClient({ servers: urlWithCredentials() }), "ida")
  })
})

describe("secrets", () => {
  it("appear in no output of any run, and serve's startup line shows NATS_URL redacted", async () => {
    await Promise.allSettled(clients.map((client) => client.close()))
    // Stopped here so that their shutdown lines are searched too.
    await Promise.all(Object.values(serves).map((serve) => stop(serve)))
    expect(Object.keys(serves).sort()).toEqual(["jwt", "mtls", "nkey", "tls", "token", "url", "wrong"])
    expect(outputs.length).toBeGreaterThan(15)
    for (const [name, value] of Object.entries(secrets)) expect(value, name).toMatch(/^[A-Za-z]\w{20,}$/)
    const leaks = outputs.flatMap((output) => {
      const text = output.text()
      return [
        ...Object.entries(secrets)
          .filter(([, value]) => text.includes(value))
          .map(([secretName]) => `${output.name} holds the ${secretName}`),
        ...(/\bSU[A-Z2-7]{40,}/.test(text) ? [`${output.name} holds an nkey seed`] : [])
      ]
    })
    expect(leaks).toEqual([])

    // Whether serve (url) served or failed, it names its server only redacted (the test above checks the line).
    expect(serves.url!.output()).toContain(`nats://quota-url:***@127.0.0.1:${servers.url.port}`)
    expect(servingLine("tls")).toEqual({
      servers: url("tls"),
      auth: "user quota-coordinator with a password",
      tls: `CA ${certs.caFile}`
    })
    expect(servingLine("token")).toMatchObject({ auth: "token" })
    expect(servingLine("jwt")).toMatchObject({ auth: `creds file ${files.coordinatorCreds}` })
    expect(servingLine("nkey")).toMatchObject({ auth: `nkey seed file ${files.coordinatorSeed}` })
  })
})
