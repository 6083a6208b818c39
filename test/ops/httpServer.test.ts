/**
 * The operations HTTP server against careless or hostile callers, over real sockets: idle sockets do
 * not keep /healthz from answering, sockets that send nothing are closed within the headers timeout,
 * an endless body to a path that takes none is answered and its connection closed at once (not read
 * for as long as it comes), oversized headers are refused, and /readyz's 503 names what is down in
 * fixed words while the error itself (hosts, users) goes only to the log.
 */
import { once } from "node:events"
import { request } from "node:http"
import { connect } from "node:net"
import type { Socket } from "node:net"
import { Effect, Exit, Scope } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import {
  httpConnectionsMax,
  httpHeaderBytesMax,
  httpHeadersTimeoutMs,
  httpIdleSocketTimeoutMs,
  httpTimeoutCheckIntervalMs
} from "../../src/domain/limits.js"
import { startHttpServer } from "../../src/ops/HttpServer.js"
import { makePrometheusMetrics } from "../../src/ops/PrometheusMetrics.js"
import type { ReadinessChange } from "../../src/ops/Readiness.js"
import { makeReadiness, postgresReasons } from "../../src/ops/Readiness.js"

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** When the socket closes (not `once`, which rejects on the EPIPE of writing to a closed one). */
const closeOf = (socket: Socket): Promise<void> =>
  new Promise((resolve) => socket.once("close", () => resolve()))

/** The Postgres error of a refused connection, as `pg` words it: a host, a port, a database user. */
const postgresError = new Error(
  'connect ECONNREFUSED 10.20.30.40:5432 (database "quota_prod", user "quota_owner")'
)

let scope: Scope.Closeable
let port: number
const changes: Array<ReadinessChange> = []
const opened: Array<Socket> = []
/** What the ownership rounds' survey says (serve.ts reads it from the rounds). */
let unownedPartitions: ReadonlyArray<number> = []

beforeAll(async () => {
  scope = Effect.runSync(Scope.make())
  const readiness = makeReadiness((change) => changes.push(change))
  readiness.watchNats(() => true)
  readiness.watchPartitions(() => unownedPartitions)
  const server = await Effect.runPromise(
    Effect.gen(function* () {
      yield* readiness.watchPostgres(Effect.fail(postgresError), { intervalMs: 100 })
      return yield* startHttpServer({
        host: "127.0.0.1",
        port: 0,
        metrics: makePrometheusMetrics({ meters: ["tokens"], plans: ["free"], processMetrics: false }),
        readiness,
        onError: () => {}
      })
    }).pipe(Scope.provide(scope))
  )
  port = server.port
})

/** Each test starts with no connection of an earlier one left (the server sees them close). */
afterEach(async () => {
  for (const socket of opened.splice(0)) socket.destroy()
  await sleep(100)
})

afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

interface Answer {
  readonly status: number
  readonly body: string
}

/** One GET on a fresh connection; rejects on a refused or reset connection or after `timeoutMs`. */
const get = (path: string, timeoutMs = 1_000): Promise<Answer> =>
  new Promise((resolve, reject) => {
    const sent = request({ host: "127.0.0.1", port, path, agent: false, timeout: timeoutMs }, (response) => {
      let body = ""
      response.on("data", (chunk: Buffer) => (body += chunk.toString()))
      response.on("end", () => resolve({ status: response.statusCode ?? 0, body }))
      response.on("error", reject)
    })
    sent.on("timeout", () => sent.destroy(new Error(`no answer within ${timeoutMs} ms`)))
    sent.on("error", reject)
    sent.end()
  })

/** How long until GET /healthz answers 200, asking again after each failure; throws past `withinMs`. */
const healthzAnswersAfterMs = async (withinMs: number): Promise<number> => {
  const started = performance.now()
  let last = "never asked"
  while (performance.now() - started < withinMs) {
    try {
      const answer = await get("/healthz", 500)
      if (answer.status === 200) return performance.now() - started
      last = `status ${answer.status}`
    } catch (error) {
      last = (error as Error).message
    }
    await sleep(50)
  }
  throw new Error(`/healthz did not answer 200 within ${withinMs} ms (last: ${last})`)
}

/** `count` connections that send nothing; each records when the server closed it. */
const openIdle = async (count: number) => {
  const sockets = await Promise.all(
    Array.from({ length: count }, async () => {
      const socket = connect({ host: "127.0.0.1", port })
      socket.on("error", () => {})
      opened.push(socket)
      await once(socket, "connect")
      const closedAt = new Promise<number>((resolve) =>
        socket.once("close", () => resolve(performance.now()))
      )
      return { socket, closedAt }
    })
  )
  const openedAt = performance.now()
  // The server accepts them in its own turns: the first probe must not race ahead of that.
  await sleep(200)
  return { sockets, openedAt }
}

/**
 * Sends `head` then chunks of a chunked body for as long as the connection stays open (at most
 * `forMs`): what came back, how many body bytes the server took, and when it closed the connection.
 */
const endlessBody = async (head: string, forMs: number) => {
  const socket = connect({ host: "127.0.0.1", port })
  opened.push(socket)
  let answer = ""
  let closed = false
  socket.on("data", (chunk: Buffer) => (answer += chunk.toString()))
  socket.on("error", () => {})
  const closedPromise = closeOf(socket).then(() => {
    closed = true
  })
  await once(socket, "connect")
  const started = performance.now()
  socket.write(head)
  const chunk = Buffer.from(`4000\r\n${"x".repeat(0x4000)}\r\n`)
  let bodyBytes = 0
  while (!closed && performance.now() - started < forMs) {
    if (socket.destroyed || !socket.writable) break
    bodyBytes += chunk.length
    // `once` rejects on the socket's error (EPIPE once the server closed): that ends the loop too.
    if (!socket.write(chunk))
      await Promise.race([once(socket, "drain").catch(() => undefined), closedPromise, sleep(100)])
  }
  await Promise.race([closedPromise, sleep(200)])
  const closedAfterMs = closed ? performance.now() - started : undefined
  socket.destroy()
  return { answer, bodyBytes, closedAfterMs }
}

describe("operations HTTP server: idle sockets", () => {
  it("64 idle sockets do not keep /healthz from answering", async () => {
    const { sockets } = await openIdle(64)
    const tookMs = await healthzAnswersAfterMs(5_000)
    console.log(`/healthz with 64 idle sockets open: 200 after ${tookMs.toFixed(1)} ms`)
    expect(tookMs).toBeLessThan(500)
    expect(sockets).toHaveLength(64)
  })

  it("more idle sockets than the connection cap are all closed within the idle timeout, and /healthz answers", async () => {
    const boundMs = httpIdleSocketTimeoutMs + 1_000
    const { sockets, openedAt } = await openIdle(httpConnectionsMax + 20)
    const tookMs = await healthzAnswersAfterMs(boundMs)
    const allClosed = Promise.all(sockets.map(({ closedAt }) => closedAt))
    const closedAt = await Promise.race([allClosed, sleep(boundMs).then(() => undefined)])
    expect(closedAt, `some of the idle sockets were still open after ${boundMs} ms`).toBeDefined()
    const lastClosedMs = Math.max(...closedAt!.map((at) => at - openedAt))
    console.log(
      `${sockets.length} idle sockets: /healthz 200 after ${tookMs.toFixed(0)} ms; all closed by the server within ${lastClosedMs.toFixed(0)} ms`
    )
    expect(lastClosedMs).toBeLessThan(boundMs)
  })

  it("a socket that drips its headers a byte at a time is closed within the headers timeout", async () => {
    const boundMs = httpHeadersTimeoutMs + httpTimeoutCheckIntervalMs + 1_000
    const socket = connect({ host: "127.0.0.1", port })
    opened.push(socket)
    socket.on("error", () => {})
    await once(socket, "connect")
    const started = performance.now()
    const closed = closeOf(socket).then(() => performance.now() - started)
    socket.write("GET /healthz HTTP/1.1\r\nX-Slow: ")
    // A byte every 200 ms: never idle long enough for the idle timeout, never done.
    const drip = setInterval(() => socket.write("a"), 200)
    const closedAfterMs = await Promise.race([closed, sleep(boundMs + 5_000).then(() => undefined)])
    clearInterval(drip)
    console.log(`headers dripped a byte per 200 ms: closed after ${closedAfterMs?.toFixed(0)} ms`)
    expect(closedAfterMs).toBeDefined()
    expect(closedAfterMs!).toBeLessThan(boundMs)
  })
})

describe("operations HTTP server: bodies and headers", () => {
  const chunked = (method: string, path: string) =>
    `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n`

  it.each([
    ["a 405 path", "POST", "/metrics", "405"],
    ["a 404 path", "PUT", "/nope", "404"],
    ["a GET endpoint", "GET", "/healthz", "413"]
  ])(
    "an endless chunked body to %s is answered and its connection closed at once",
    async (_, method, path, status) => {
      const sent = await endlessBody(chunked(method, path), 3_000)
      console.log(
        `${method} ${path} with an endless body: ${sent.answer.split("\r\n", 1)[0]}, closed after ${sent.closedAfterMs?.toFixed(0)} ms, ${sent.bodyBytes} body bytes handed to the socket`
      )
      expect(sent.answer.startsWith(`HTTP/1.1 ${status} `)).toBe(true)
      expect(sent.closedAfterMs).toBeDefined()
      expect(sent.closedAfterMs!).toBeLessThan(1_000)
    }
  )

  it("headers over the cap are answered 431 and the connection closed", async () => {
    const filler = "a".repeat(httpHeaderBytesMax + 1_024)
    const socket = connect({ host: "127.0.0.1", port })
    opened.push(socket)
    let answer = ""
    socket.on("data", (chunk: Buffer) => (answer += chunk.toString()))
    socket.on("error", () => {})
    await once(socket, "connect")
    socket.write(`GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: ${filler}\r\n\r\n`)
    await Promise.race([closeOf(socket), sleep(2_000)])
    expect(answer.startsWith("HTTP/1.1 431 ")).toBe(true)
    expect(socket.destroyed || socket.readableEnded).toBe(true)
    // Headers within the cap are served as before.
    expect((await get("/healthz")).status).toBe(200)
  })
})

describe("GET /readyz while Postgres is down", () => {
  it("names postgres with a fixed reason, and the error's text reaches only the log", async () => {
    await sleep(300)
    const answer = await get("/readyz")
    expect(answer.status).toBe(503)
    expect(JSON.parse(answer.body)).toEqual({
      status: "not_ready",
      down: ["postgres"],
      reasons: { postgres: postgresReasons.failed }
    })
    for (const secret of ["10.20.30.40", "5432", "quota_prod", "quota_owner", "ECONNREFUSED"])
      expect(answer.body).not.toContain(secret)
    // Told once of the change, with the whole error, though the check failed every 100 ms since.
    expect(changes).toEqual([
      { dependency: "postgres", down: postgresReasons.failed, detail: postgresError.message }
    ])
  })
})

describe("GET /readyz when partitions have had no owner for longer than a lease", () => {
  it("lists them, without changing what is down", async () => {
    unownedPartitions = [2, 6]
    const answer = await get("/readyz")
    unownedPartitions = []
    expect({ status: answer.status, body: JSON.parse(answer.body) as unknown }).toEqual({
      status: 503,
      body: {
        status: "not_ready",
        down: ["postgres"],
        reasons: { postgres: postgresReasons.failed },
        unownedPartitions: [2, 6]
      }
    })
    expect(JSON.parse((await get("/readyz")).body)).not.toHaveProperty("unownedPartitions")
  })
})
