/**
 * `quota-coordinator demo` end to end, as a person runs it: a child process on embedded defaults, once
 * on the machine's NATS and once with no NATS (the in-process transport). Every seed's race must come
 * out as the protocol promises, the load run must report its throughput and zero over-grants, and the
 * temporary database must be gone afterwards.
 */
import { spawn } from "node:child_process"
import { existsSync } from "node:fs"
import { describe, expect, it } from "vitest"
import { parseDemoArgs } from "../../src/cli/demo.js"
import { grouped } from "../../src/cli/demoOutput.js"
import { scenarios } from "../../src/cli/demoScenarios.js"

interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
  readonly ms: number
}

const runDemo = (env: NodeJS.ProcessEnv, args: ReadonlyArray<string>): Promise<Run> =>
  new Promise((resolve, reject) => {
    const startedAt = Date.now()
    const child = spawn("npx", ["tsx", "src/cli/main.ts", "demo", ...args], {
      env: { ...process.env, NO_COLOR: "1", ...env },
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")))
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")))
    const timer = setTimeout(() => child.kill("SIGKILL"), 55_000)
    child.on("error", reject)
    child.on("close", (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr, ms: Date.now() - startedAt })
    })
  })

const expectAllHeld = (run: Run) => {
  const context = `stdout:\n${run.stdout}\nstderr:\n${run.stderr}`
  expect(run.code, context).toBe(0)
  for (const scenario of scenarios) {
    const seedNumber = scenario.seed.split(" ")[0] as string
    expect(run.stdout, context).toContain(`seed ${scenario.seed}`)
    expect(run.stdout, context).toContain(`✓ ${seedNumber} held`)
  }
  expect(run.stdout, context).not.toContain("✗")
  expect(run.stdout, context).toMatch(/throughput: [\d ]+ commands\/s/)
  expect(run.stdout, context).toMatch(/latency per message: p50 [\d.]+ ms, p99 [\d.]+ ms/)
  expect(run.stdout, context).toMatch(
    /✓ correctness.*over-grants 0, wrongful refusals 0, replies off the client's ledger 0/
  )
  expect(run.stdout, context).toContain(`${scenarios.length} of ${scenarios.length} races closed`)
  const directory = /embedded Postgres \(PGlite\) in (\S+),/.exec(run.stdout)?.[1]
  expect(directory, context).toBeDefined()
  expect(existsSync(directory as string), `${directory} should be removed`).toBe(false)
}

describe("quota-coordinator demo", () => {
  it("replays every seed's race on NATS, then a load run, and exits 0", async () => {
    const run = await runDemo({ NATS_URL: "nats://127.0.0.1:4222" }, ["--requests", "2000"])
    expectAllHeld(run)
    expect(run.stdout).toMatch(
      /transport {2}NATS at nats:\/\/127\.0\.0\.1:4222, subjects quota-demo-[0-9a-f]{8}\.v1\./
    )
  })

  it("falls back to the in-process transport when no NATS answers", async () => {
    // A port nothing listens on: the probe is refused at once.
    const run = await runDemo({ NATS_URL: "nats://127.0.0.1:1" }, ["--requests", "2000"])
    expectAllHeld(run)
    expect(run.stdout).toContain("transport  in-process (no NATS at nats://127.0.0.1:1")
  })

  it("refuses an argument it does not know", async () => {
    const run = await runDemo({}, ["--fast"])
    expect(run.code).toBe(2)
    expect(run.stderr).toContain("Unknown option '--fast'")
  })
})

describe("demo arguments", () => {
  it("reads --requests and --duration, in both spellings", () => {
    expect(parseDemoArgs([])).toEqual({ requests: undefined, durationMs: 3_000 })
    expect(parseDemoArgs(["--requests", "2000"])).toEqual({ requests: 2_000, durationMs: 3_000 })
    expect(parseDemoArgs(["--requests=50", "--duration=2s"])).toEqual({ requests: 50, durationMs: 2_000 })
    expect(parseDemoArgs(["--requests", "0"])).toHaveProperty("error")
    expect(parseDemoArgs(["--requests"])).toHaveProperty("error")
    expect(parseDemoArgs(["--duration", "forever"])).toHaveProperty("error")
  })

  it("writes numbers as the seeds do", () => {
    expect(grouped(4_985)).toBe("4 985")
    expect(grouped(400_000)).toBe("400 000")
    expect(grouped(999)).toBe("999")
    expect(grouped(1_050_000)).toBe("1 050 000")
  })
})
