/**
 * The operations endpoint from a test's side: a coordinator's `serve` run in this process (real NATS,
 * real Postgres, the real HTTP server on a free port), and its /metrics read back as numbers.
 */
import net from "node:net"
import { Deferred, Effect, Exit, Fiber } from "effect"
import { QuotaClient } from "../../src/client/QuotaClient.js"
import { serve } from "../../src/cli/serve.js"
import { testServeEnv } from "./eventStreams.js"
import { createTestDatabase, randomPrefix } from "./processes.js"

/** A port nothing listens on right now (the OS's pick, released at once). */
export const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo
      server.close(() => resolve(port))
    })
  })

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Polls `check` until it returns a value other than undefined; throws with `describe()` past `timeoutMs`. */
export const waitFor = async <A>(
  check: () => Promise<A | undefined>,
  timeoutMs: number,
  describe: () => string | Promise<string>
): Promise<A> => {
  const until = Date.now() + timeoutMs
  for (;;) {
    const value = await check().catch(() => undefined)
    if (value !== undefined) return value
    if (Date.now() > until) throw new Error(`not within ${timeoutMs} ms: ${await describe()}`)
    await sleep(100)
  }
}

/** A Prometheus text sample: the series (`name{a="b",...}` as written) and its value. */
export type Samples = ReadonlyMap<string, number>

/** Parses the exposition text into series -> value (labels in the order prom-client writes them). */
export const parseMetrics = (text: string): Samples => {
  const samples = new Map<string, number>()
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue
    const space = line.lastIndexOf(" ")
    samples.set(line.slice(0, space), Number(line.slice(space + 1)))
  }
  return samples
}

/** The value of `name` with exactly `labels` (any order), 0 when the series does not exist. */
export const sample = (samples: Samples, name: string, labels: Record<string, string> = {}): number => {
  const wanted = Object.entries(labels)
    .map(([key, value]) => `${key}="${value}"`)
    .sort()
  for (const [series, value] of samples) {
    const brace = series.indexOf("{")
    const seriesName = brace < 0 ? series : series.slice(0, brace)
    if (seriesName !== name) continue
    const seriesLabels =
      brace < 0
        ? []
        : series
            .slice(brace + 1, -1)
            .split(",")
            .sort()
    if (seriesLabels.join(",") === wanted.join(",")) return value
  }
  return 0
}

export const scrape = async (port: number): Promise<Samples> => {
  const response = await fetch(`http://127.0.0.1:${port}/metrics`)
  if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`)
  return parseMetrics(await response.text())
}

export const readyz = async (port: number): Promise<{ status: number; body: Record<string, unknown> }> => {
  const response = await fetch(`http://127.0.0.1:${port}/readyz`)
  return { status: response.status, body: (await response.json()) as Record<string, unknown> }
}

export interface InProcessServe {
  readonly httpPort: number
  /** Stops it as SIGTERM would (drain, flush) and waits until it has. */
  readonly stop: () => Promise<void>
}

/** Runs `serve` in this process with `env` (its HTTP server on a free port) until `stop`. */
export const startServeInProcess = async (env: Record<string, string>): Promise<InProcessServe> => {
  const httpPort = await freePort()
  const stopped = Deferred.makeUnsafe<void>()
  const fiber = Effect.runFork(
    Effect.scoped(
      serve(
        { LOG_LEVEL: "silent", ...testServeEnv, ...env, QUOTA_HTTP_ADDR: `127.0.0.1:${httpPort}` },
        Deferred.await(stopped)
      )
    )
  )
  return {
    httpPort,
    stop: async () => {
      Deferred.doneUnsafe(stopped, Exit.void)
      const exit = await Effect.runPromise(Fiber.await(fiber))
      if (Exit.isFailure(exit)) throw new Error(`serve failed: ${String(exit.cause)}`)
    }
  }
}

export interface ServedCoordinator {
  readonly prefix: string
  readonly natsUrl: string
  /** Its own database (schema `quota`), for tests that read or seed rows. */
  readonly databaseUrl: string
  readonly httpPort: number
  /** A client of this coordinator's prefix. */
  readonly client: QuotaClient
  readonly close: () => Promise<void>
}

/**
 * A database of its own, `serve` on it in this process with a fresh prefix, waited for until it owns
 * every partition, and a client: what a test of the running service starts from.
 */
export const startServedCoordinator = async (
  label: string,
  env: Record<string, string> = {}
): Promise<ServedCoordinator> => {
  const natsUrl = process.env["NATS_URL"] ?? "nats://127.0.0.1:4222"
  const prefix = randomPrefix(label)
  const database = await createTestDatabase(label)
  const running = await startServeInProcess({
    DATABASE_URL: database.url,
    NATS_URL: natsUrl,
    QUOTA_PREFIX: prefix,
    QUOTA_LEASE_MS: "3000",
    ...env
  })
  await waitFor(
    async () => (sample(await scrape(running.httpPort), "quota_partitions_owned") === 64 ? true : undefined),
    20_000,
    () => "the coordinator did not claim all 64 partitions"
  )
  const client = await QuotaClient.connect({ servers: natsUrl, prefix })
  return {
    prefix,
    natsUrl,
    databaseUrl: database.url,
    httpPort: running.httpPort,
    client,
    close: async () => {
      await client.close()
      await running.stop()
      await database.drop()
    }
  }
}
