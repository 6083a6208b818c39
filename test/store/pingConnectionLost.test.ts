/**
 * The readiness ping checks a connection out of the store's pool. A connection that dies while the ping
 * has it emits 'error' on the checked-out client besides failing the query; unheard, that event crashed
 * the process (found by the nemesis: a member-lock loss and Postgres resets, `Unhandled 'error' event ...
 * Connection terminated unexpectedly`). The ping must fail, and the process go on.
 */
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import { pingWritable } from "../../src/store/postgres/writablePrimary.js"
import { testDatabaseUrl } from "../support/database.js"
import type { TcpProxy } from "../support/tcpProxy.js"
import { startTcpProxy } from "../support/tcpProxy.js"

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

describe("the readiness ping on a connection that dies", () => {
  let proxy: TcpProxy | undefined
  let pool: pg.Pool | undefined
  afterAll(async () => {
    await pool?.end().catch(() => undefined)
    await proxy?.close()
  })

  it("fails the ping and is heard, not thrown at the process", async () => {
    const target = new URL(testDatabaseUrl)
    proxy = await startTcpProxy(target.hostname, Number(target.port || 5432))
    const through = new URL(testDatabaseUrl)
    through.hostname = "127.0.0.1"
    through.port = String(proxy.port)
    pool = new pg.Pool({ connectionString: through.toString(), max: 1 })
    pool.on("error", () => {})
    const uncaught: Array<unknown> = []
    const onUncaught = (error: unknown) => uncaught.push(error)
    process.on("uncaughtException", onUncaught)
    try {
      await pingWritable(pool)
      // The ping's query is on its way when the connection is reset.
      proxy.silence()
      const ping = pingWritable(pool).then(
        () => "answered",
        (error: unknown) => `failed: ${String(error)}`
      )
      await sleep(200)
      await proxy.cut()
      expect(await ping).toMatch(/^failed: /)
      await sleep(100)
      expect(uncaught.map(String)).toEqual([])
    } finally {
      process.off("uncaughtException", onUncaught)
    }
  })
})
