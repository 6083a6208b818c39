/**
 * The security test infrastructure (test/support/natsServerProcess.ts) against real nats-server
 * processes of our own: TLS and mutual TLS, user/password, nkeys, operator/account/user JWTs with
 * JetStream, subject permissions, and the example config of deploy/nats.
 */
import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect, credsAuthenticator, errors, nkeyAuthenticator } from "@nats-io/transport-node"
import type { NatsConnection, NodeConnectionOptions } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  makeCertificates,
  makeDecentralizedAuth,
  newNkeyUser,
  pem,
  startNatsServer
} from "../support/natsServerProcess.js"
import type { DecentralizedAuth, NatsServerProcess, TestCertificates } from "../support/natsServerProcess.js"

let dir: string
let certs: TestCertificates
let auth: DecentralizedAuth
const nkeyUser = newNkeyUser()
/** Filled as each server starts, so that afterAll stops those that did if another failed. */
const servers = {} as Record<"tls" | "mtls" | "nkey" | "jwt" | "deploy", NatsServerProcess>
const connections: Array<NatsConnection> = []
const passwords = { coordinator: "coordinatorSecret", service: "serviceSecret", operator: "operatorSecret" }
/** As deploy/nats/README.md says: plain, a bcrypt hash quoted inside the variable, a $2a$ hash as is. */
const deployEnv = {
  QUOTA_COORDINATOR_PASSWORD: passwords.coordinator,
  QUOTA_SERVICE_PASSWORD: '"$2b$04$quotaCoordinatorTestSOXcEz7nACSQ1orzg4EeN0Ikani.JLh.G"',
  QUOTA_OPERATOR_PASSWORD: "$2a$04$quotaCoordinatorTestSOeGBgLcjFVsHivBHEDW1N8Z/YC0UO4zi"
}

/** `text` with the line `pattern` matches replaced; throws if none does (never run on the real port). */
const replaceLine = (text: string, pattern: RegExp, line: string) => {
  if (!pattern.test(text)) throw new Error(`deploy/nats/nats-server.conf has no line matching ${pattern}`)
  return text.replace(pattern, line)
}

type StartArgs = Parameters<typeof startNatsServer> extends [string, ...infer Rest] ? Rest : never

const open = async (server: NatsServerProcess, options: NodeConnectionOptions = {}) => {
  const nc = await connect({ servers: server.url, reconnect: false, timeout: 5_000, ...options })
  connections.push(nc)
  return nc
}

/** The first error the server reports on `nc` (its `-ERR`, surfaced on the status iterator). */
const nextStatusError = async (nc: NatsConnection): Promise<Error> => {
  for await (const status of nc.status()) if (status.type === "error") return status.error
  throw new Error("connection closed without an error status")
}

/** The reply to an empty request, as text. */
const ask = async (nc: NatsConnection, subject: string) =>
  (await nc.request(subject, "", { timeout: 5_000 })).string()

/** The error an empty request fails with. */
const refusal = (nc: NatsConnection, subject: string) =>
  nc.request(subject, "", { timeout: 5_000 }).then(
    () => new Error(`${subject}: a reply, not a refusal`),
    (error: Error) => error
  )

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "qc-nats-security-"))
  ;[certs, auth] = await Promise.all([makeCertificates(join(dir, "certs")), makeDecentralizedAuth()])
  const tls = `tls { cert_file: "${certs.serverCertFile}", key_file: "${certs.serverKeyFile}"`
  const deployConfig = await readFile(new URL("../../deploy/nats/nats-server.conf", import.meta.url), "utf8")
  const start = async (name: keyof typeof servers, ...args: StartArgs) => {
    servers[name] = await startNatsServer(dir, ...args)
  }
  const results = await Promise.allSettled([
    start(
      "tls",
      (port) =>
        `listen: 127.0.0.1:${port}\n${tls} }\nauthorization { user: alice, password: $ALICE_PASSWORD }\n`,
      { ALICE_PASSWORD: "wonderland" }
    ),
    start(
      "mtls",
      (port) => `listen: 127.0.0.1:${port}\n${tls}, ca_file: "${certs.caFile}", verify: true }\n`
    ),
    start(
      "nkey",
      (port) => `listen: 127.0.0.1:${port}\nauthorization { users = [ { nkey: ${nkeyUser.publicKey} } ] }\n`
    ),
    start(
      "jwt",
      (port) =>
        `listen: 127.0.0.1:${port}\njetstream { store_dir: "${join(dir, `js-${port}`)}" }\n${auth.serverConfig}`
    ),
    start(
      "deploy",
      (port) =>
        replaceLine(
          replaceLine(deployConfig, /^listen:.*$/m, `listen: 127.0.0.1:${port}`),
          /^\s*store_dir:.*$/m,
          `  store_dir: "${join(dir, `deploy-js-${port}`)}"`
        ),
      deployEnv
    )
  ])
  for (const result of results) if (result.status === "rejected") throw result.reason
})

afterAll(async () => {
  await Promise.allSettled(connections.map((nc) => nc.close()))
  await Promise.all(Object.values(servers).map((server) => server.stop()))
  if (dir !== undefined) await rm(dir, { recursive: true, force: true })
})

describe("TLS with user and password", () => {
  it("connects when the CA is trusted and the password is right", async () => {
    const nc = await open(servers.tls, {
      tls: { ca: await pem(certs.caFile) },
      user: "alice",
      pass: "wonderland"
    })
    await nc.flush()
    expect(nc.info?.tls_required).toBe(true)
  })

  it("refuses a server certificate signed by another CA", async () => {
    await expect(
      open(servers.tls, { tls: { ca: await pem(certs.otherCaFile) }, user: "alice", pass: "wonderland" })
    ).rejects.toThrow(/unable to verify the first certificate/)
  })

  it("refuses a wrong password with an authorization error", async () => {
    const attempt = open(servers.tls, { tls: { ca: await pem(certs.caFile) }, user: "alice", pass: "guess" })
    await expect(attempt).rejects.toBeInstanceOf(errors.AuthorizationError)
  })
})

describe("mutual TLS", () => {
  it("connects with a client certificate signed by the CA", async () => {
    const tls = {
      ca: await pem(certs.caFile),
      cert: await pem(certs.clientCertFile),
      key: await pem(certs.clientKeyFile)
    }
    const nc = await open(servers.mtls, { tls })
    await nc.flush()
  })

  it("refuses a client without a certificate", async () => {
    // The client sees only a reset (ECONNRESET); the server says why.
    await expect(open(servers.mtls, { tls: { ca: await pem(certs.caFile) } })).rejects.toThrow()
    expect(servers.mtls.output()).toContain("client didn't provide a certificate")
  })
})

describe("nkey user", () => {
  it("connects with the seed", async () => {
    const nc = await open(servers.nkey, {
      authenticator: nkeyAuthenticator(new TextEncoder().encode(nkeyUser.seed))
    })
    await nc.flush()
  })

  it("refuses another seed", async () => {
    const other = newNkeyUser()
    const attempt = open(servers.nkey, {
      authenticator: nkeyAuthenticator(new TextEncoder().encode(other.seed))
    })
    await expect(attempt).rejects.toBeInstanceOf(errors.AuthorizationError)
  })
})

describe("operator, account and user JWTs", () => {
  const withCreds = async (creds: string) =>
    open(servers.jwt, { authenticator: credsAuthenticator(new TextEncoder().encode(creds)) })

  it("a .creds user publishes and receives, and its account has JetStream", async () => {
    const nc = await withCreds(await auth.userCreds("app"))
    const sub = nc.subscribe("hello.>", { max: 1 })
    nc.publish("hello.world", "hi")
    for await (const msg of sub) expect(msg.string()).toBe("hi")
    const info: unknown = JSON.parse(await ask(nc, "$JS.API.INFO"))
    expect(info).not.toHaveProperty("error")
    expect(info).toMatchObject({ type: "io.nats.jetstream.api.v1.account_info_response" })
  })

  it("a permission violation: an error status on publish, a RequestError caused by it on request", async () => {
    const responder = await withCreds(await auth.userCreds("coordinator"))
    responder.subscribe("quota.v1.>", {
      callback: (_err, msg) => {
        msg.respond(`ok ${msg.subject}`)
      }
    })
    await responder.flush()
    const service = await withCreds(
      await auth.userCreds("service", { publish: ["quota.v1.*.ops"], subscribe: ["_INBOX.>"] })
    )
    expect(await ask(service, "quota.v1.3.ops")).toBe("ok quota.v1.3.ops")

    const statusError = nextStatusError(service)
    service.publish("quota.v1.3.admin", "")
    const published = await statusError
    expect(published).toBeInstanceOf(errors.PermissionViolationError)
    expect(published).toMatchObject({ operation: "publish", subject: "quota.v1.3.admin" })

    const failed = await refusal(service, "quota.v1.3.admin")
    expect(failed).toBeInstanceOf(errors.RequestError)
    expect(failed.cause).toBeInstanceOf(errors.PermissionViolationError)
    expect(failed.message).toMatch(/Permissions Violation for Publish to "quota.v1.3.admin"/)
    // A violation is not fatal: the connection stays open and usable.
    expect(service.isClosed()).toBe(false)
    expect(await ask(service, "quota.v1.4.ops")).toBe("ok quota.v1.4.ops")
  })
})

describe("deploy/nats/nats-server.conf", () => {
  const as = (user: "coordinator" | "service" | "operator") =>
    open(servers.deploy, { user: `quota-${user}`, pass: passwords[user] })

  it("lets a service use .ops only, the operator .ops and .admin, the coordinator answer both", async () => {
    const coordinator = await as("coordinator")
    const received: Array<string> = []
    coordinator.subscribe("quota.v1.>", {
      callback: (_err, msg) => {
        received.push(msg.subject)
        msg.respond(`ok ${msg.subject}`)
      }
    })
    await coordinator.flush()
    const service = await as("service")
    const operator = await as("operator")

    expect(await ask(service, "quota.v1.3.ops")).toBe("ok quota.v1.3.ops")
    // quota.v1.events.ops matches quota.v1.*.ops: denied so that no one forges events.
    for (const subject of ["quota.v1.3.admin", "quota.v1.events.ops"])
      expect((await refusal(service, subject)).cause).toBeInstanceOf(errors.PermissionViolationError)

    for (const subject of ["quota.v1.3.ops", "quota.v1.3.admin"])
      expect(await ask(operator, subject)).toBe(`ok ${subject}`)
    expect(received).toEqual(["quota.v1.3.ops", "quota.v1.3.ops", "quota.v1.3.admin"])

    expect(JSON.parse(await ask(coordinator, "$JS.API.INFO"))).not.toHaveProperty("error")
  })

  it("refuses the service a subscription to requests (it could read other services' traffic)", async () => {
    const service = await as("service")
    const statusError = nextStatusError(service)
    const sub = service.subscribe("quota.v1.>")
    expect(await statusError).toMatchObject({ operation: "subscription", subject: "quota.v1.>" })
    // The subscription is closed with that error.
    expect(await sub.closed).toBeInstanceOf(errors.PermissionViolationError)
  })
})
