/**
 * Real `nats-server` processes for security tests: each on a free loopback port of its own (never the
 * shared NATS on 4222), with TLS certificates made by `openssl`, nkey users and an operator/account/user
 * JWT setup made with @nats-io/nkeys and @nats-io/jwt.
 *
 * JetStream: put `jetstream { store_dir: "<dir>/js" }` into the config text.
 */
import { execFile, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { once } from "node:events"
import { mkdir, readFile, writeFile } from "node:fs/promises"
import { createServer, connect as tcpConnect } from "node:net"
import { join } from "node:path"
import { promisify } from "node:util"
import {
  createAccount,
  createOperator,
  encodeAccount,
  encodeOperator,
  encodeUser,
  fmtCreds
} from "@nats-io/jwt"
import { createUser } from "@nats-io/nkeys"

const run = promisify(execFile)
const natsServerBinary = process.env["NATS_SERVER_BIN"] ?? "/usr/sbin/nats-server"
const readyTimeoutMs = 10_000
const stopTimeoutMs = 5_000

/** A free TCP port on 127.0.0.1 (listen on 0, read the port, close). */
export const freeLoopbackPort = async (): Promise<number> => {
  const server = createServer()
  server.listen(0, "127.0.0.1")
  await once(server, "listening")
  const address = server.address()
  await new Promise<void>((resolve) => server.close(() => resolve()))
  if (address === null || typeof address === "string") throw new Error("no TCP address")
  return address.port
}

export interface TestCertificates {
  readonly dir: string
  /** CA certificate (PEM) that signs the server and client certs. */
  readonly caFile: string
  /** Server certificate, SAN IP:127.0.0.1 and DNS:localhost. */
  readonly serverCertFile: string
  readonly serverKeyFile: string
  /** Client certificate for mutual TLS, CN=quota-client. */
  readonly clientCertFile: string
  readonly clientKeyFile: string
  /** A second, unrelated CA (for "server certificate not trusted" tests). */
  readonly otherCaFile: string
}

const openssl = async (args: ReadonlyArray<string>) => {
  try {
    await run("openssl", [...args])
  } catch (cause) {
    const stderr = (cause as { stderr?: unknown }).stderr
    throw new Error(`openssl ${args.join(" ")} failed: ${String(stderr ?? cause)}`, { cause })
  }
}

const ecKey = (file: string) =>
  openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", file])

const selfSignedCa = async (dir: string, name: string) => {
  const key = join(dir, `${name}.key`)
  const cert = join(dir, `${name}.pem`)
  await ecKey(key)
  // -addext overrides the CA extensions of whatever openssl.cnf the machine has.
  await openssl([
    ...["req", "-x509", "-new", "-key", key, "-out", cert, "-days", "1", "-subj", `/CN=${name}`],
    ...["-addext", "basicConstraints=critical,CA:TRUE"],
    ...["-addext", "keyUsage=critical,keyCertSign,cRLSign"]
  ])
  return { key, cert }
}

const signedLeaf = async (
  dir: string,
  name: string,
  subject: string,
  extensions: string,
  ca: { readonly key: string; readonly cert: string }
) => {
  const key = join(dir, `${name}-key.pem`)
  const csr = join(dir, `${name}.csr`)
  const cert = join(dir, `${name}-cert.pem`)
  const extFile = join(dir, `${name}.ext`)
  await ecKey(key)
  await openssl(["req", "-new", "-key", key, "-out", csr, "-subj", subject])
  await writeFile(extFile, extensions)
  // A serial of its own: -CAcreateserial has both leaves, signed in parallel, write one ca.srl file,
  // and one of them sometimes read it half written ("Unable to load number").
  const serial = `0x${randomBytes(16).toString("hex")}`
  await openssl([
    ...["x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-set_serial", serial],
    ...["-out", cert, "-days", "1", "-sha256", "-extfile", extFile]
  ])
  return { key, cert }
}

/** Generates a CA, a server and a client certificate signed by it, and an unrelated CA, into `dir`. */
export const makeCertificates = async (dir: string): Promise<TestCertificates> => {
  await mkdir(dir, { recursive: true })
  const [ca, other] = await Promise.all([selfSignedCa(dir, "ca"), selfSignedCa(dir, "other-ca")])
  const leafBase = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
  const [server, client] = await Promise.all([
    signedLeaf(
      dir,
      "server",
      "/CN=localhost",
      `${leafBase}extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n`,
      ca
    ),
    signedLeaf(dir, "client", "/CN=quota-client", `${leafBase}extendedKeyUsage=clientAuth\n`, ca)
  ])
  return {
    dir,
    caFile: ca.cert,
    serverCertFile: server.cert,
    serverKeyFile: server.key,
    clientCertFile: client.cert,
    clientKeyFile: client.key,
    otherCaFile: other.cert
  }
}

export interface NatsServerProcess {
  readonly port: number
  /** "nats://127.0.0.1:<port>" */
  readonly url: string
  /** The config file it runs with. */
  readonly configFile: string
  /** Everything the server wrote (stdout and stderr), for failure messages. */
  readonly output: () => string
  /** SIGTERM, wait for exit (SIGKILL after 5 s). Idempotent. */
  readonly stop: () => Promise<void>
  /** SIGKILL (a node that dies), wait for exit. */
  readonly kill: () => Promise<void>
}

const canConnect = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = tcpConnect({ host: "127.0.0.1", port })
    socket.once("connect", () => {
      socket.destroy()
      resolve(true)
    })
    socket.once("error", () => resolve(false))
  })

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const startOnce = async (
  dir: string,
  config: (port: number) => string,
  env: Record<string, string>
): Promise<NatsServerProcess> => {
  const port = await freeLoopbackPort()
  const configFile = join(dir, `nats-${port}.conf`)
  await writeFile(configFile, config(port))
  const child = spawn(natsServerBinary, ["-c", configFile], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let output = ""
  const onData = (chunk: Buffer) => {
    output += chunk.toString()
  }
  child.stdout.on("data", onData)
  child.stderr.on("data", onData)
  let exitCode: number | string | null | undefined
  const exited = new Promise<void>((resolve) =>
    child.once("exit", (code, signal) => {
      exitCode = code ?? signal
      resolve()
    })
  )
  child.once("error", (error) => {
    output += `\nspawn ${natsServerBinary}: ${error.message}`
    exitCode = "spawn error"
  })
  let stopping: Promise<void> | undefined
  const stop = () => {
    stopping ??= (async () => {
      if (exitCode !== undefined) return
      child.kill("SIGTERM")
      const timer = setTimeout(() => child.kill("SIGKILL"), stopTimeoutMs)
      await exited
      clearTimeout(timer)
    })()
    return stopping
  }
  const deadline = Date.now() + readyTimeoutMs
  for (;;) {
    if (output.includes("Server is ready") || (exitCode === undefined && (await canConnect(port)))) break
    if (exitCode !== undefined)
      throw new Error(`nats-server -c ${configFile} exited (${exitCode}) before it was ready:\n${output}`)
    if (Date.now() > deadline) {
      await stop()
      throw new Error(`nats-server -c ${configFile} not ready after ${readyTimeoutMs} ms:\n${output}`)
    }
    await delay(25)
  }
  const kill = async () => {
    if (exitCode !== undefined) return
    child.kill("SIGKILL")
    await exited
  }
  return { port, url: `nats://127.0.0.1:${port}`, configFile, output: () => output, stop, kill }
}

/**
 * Writes `config(port)` to `<dir>/nats-<port>.conf`, starts `nats-server -c <file>` with `env` added to
 * this process's environment (the server resolves `$VAR` in its config from it), and waits until it is
 * ready. The port is free when picked; if another process takes it before the server binds, it retries
 * on another port (twice).
 */
export const startNatsServer = async (
  dir: string,
  config: (port: number) => string,
  env: Record<string, string> = {}
): Promise<NatsServerProcess> => {
  await mkdir(dir, { recursive: true })
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(dir, config, env)
    } catch (error) {
      const raced = error instanceof Error && /address already in use/i.test(error.message)
      if (!raced || attempt >= 3) throw error
    }
  }
}

/** A fresh nkey user: its seed (text starting with "SU") and public key (starting with "U"). */
export const newNkeyUser = (): { readonly seed: string; readonly publicKey: string } => {
  const user = createUser()
  return { seed: new TextDecoder().decode(user.getSeed()), publicKey: user.getPublicKey() }
}

export interface DecentralizedAuth {
  /**
   * Config lines for nats-server: `operator: <jwt>`, `system_account: <pub>`, `resolver: MEMORY`,
   * `resolver_preload: { <account pub>: <jwt>, <system pub>: <jwt> }`.
   */
  readonly serverConfig: string
  /** A `.creds` file's text (user JWT and seed) for a new user of the application account. */
  readonly userCreds: (
    name: string,
    permissions?: { publish?: ReadonlyArray<string>; subscribe?: ReadonlyArray<string> }
  ) => Promise<string>
}

/** Account limits with nothing limited, JetStream included (an absent limit in a JWT means 0). */
const unlimited = {
  subs: -1,
  data: -1,
  payload: -1,
  imports: -1,
  exports: -1,
  wildcards: true,
  conn: -1,
  leaf: -1,
  mem_storage: -1,
  disk_storage: -1,
  streams: -1,
  consumer: -1
}

/** Operator, a system account and an application account with JetStream (unlimited), signed by the operator. */
export const makeDecentralizedAuth = async (): Promise<DecentralizedAuth> => {
  const operator = createOperator()
  const system = createAccount()
  const application = createAccount()
  const operatorJwt = await encodeOperator("quota-test-operator", operator, {
    system_account: system.getPublicKey()
  })
  const systemJwt = await encodeAccount(
    "SYS",
    system,
    { limits: { subs: -1, data: -1, payload: -1, imports: -1, exports: -1, wildcards: true, conn: -1 } },
    { signer: operator }
  )
  const applicationJwt = await encodeAccount(
    "QUOTA",
    application,
    { limits: unlimited },
    { signer: operator }
  )
  const serverConfig = [
    `operator: ${operatorJwt}`,
    `system_account: ${system.getPublicKey()}`,
    "resolver: MEMORY",
    "resolver_preload: {",
    `  ${application.getPublicKey()}: ${applicationJwt}`,
    `  ${system.getPublicKey()}: ${systemJwt}`,
    "}",
    ""
  ].join("\n")
  const userCreds: DecentralizedAuth["userCreds"] = async (name, permissions = {}) => {
    const user = createUser()
    const jwt = await encodeUser(name, user, application, {
      ...(permissions.publish === undefined ? {} : { pub: { allow: [...permissions.publish] } }),
      ...(permissions.subscribe === undefined ? {} : { sub: { allow: [...permissions.subscribe] } })
    })
    return new TextDecoder().decode(fmtCreds(jwt, user))
  }
  return { serverConfig, userCreds }
}

/** A text file's contents, for TLS options (`tls: { ca: await pem(certs.caFile) }`). */
export const pem = (file: string): Promise<string> => readFile(file, "utf8")
