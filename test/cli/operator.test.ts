/**
 * The operator's subcommands against a running coordinator (real NATS and Postgres): what each prints
 * as a table and with --json, and its exit code: 0 success, 1 a refusal by the coordinator, 2 a usage
 * or connection error. Most runs call the command line in this process (`runCli`, what the program
 * runs); the last test runs the program itself, to show the codes reach the process's exit status.
 */
import { spawn } from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { QuotaClient } from "../../src/client/QuotaClient.js"
import { runCli } from "../../src/cli/cli.js"
import type { ServedCoordinator } from "../support/operations.js"
import { startServedCoordinator } from "../support/operations.js"
import { randomPrefix } from "../support/processes.js"

const natsUrl = process.env["NATS_URL"] ?? "nats://127.0.0.1:4222"
let served: ServedCoordinator
let client: QuotaClient
let prefix: string

interface Ran {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** Runs `quota-coordinator ...args` in this process with this test's prefix and NATS. */
const cli = async (args: ReadonlyArray<string>, env: Record<string, string> = {}): Promise<Ran> => {
  let stdout = ""
  let stderr = ""
  const code = await runCli(args, {
    env: { ...process.env, NATS_URL: natsUrl, QUOTA_PREFIX: prefix, ...env },
    stdout: (text) => (stdout += text),
    stderr: (text) => (stderr += text)
  })
  return { code, stdout, stderr }
}

/** Runs the program `quota-coordinator ...args` as a process with this test's prefix and NATS. */
const program = (args: ReadonlyArray<string>, env: Record<string, string> = {}): Promise<Ran> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", "src/cli/main.ts", ...args], {
      env: { ...process.env, NATS_URL: natsUrl, QUOTA_PREFIX: prefix, ...env },
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()))
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
    child.once("error", reject)
    child.once("exit", (code) => resolve({ code, stdout, stderr }))
  })

const json = (ran: Ran): Record<string, unknown> => JSON.parse(ran.stdout) as Record<string, unknown>

beforeAll(async () => {
  served = await startServedCoordinator("cli")
  ;({ client, prefix } = served)
})

afterAll(() => served?.close())

describe("quota-coordinator usage", () => {
  it("prints the plan, a row per meter and the slots; --json prints get_usage's result", async () => {
    const [table, asJson] = await Promise.all([
      cli(["usage", "cli-ann"]),
      cli(["usage", "cli-ann", "--json"])
    ])
    expect(table.code, table.stderr).toBe(0)
    expect(table.stdout).toContain('user "cli-ann", plan free')
    expect(table.stdout).toMatch(/^tokens\s+month\s+\S+\s+0\s+0\s+400000\s+400000\s+0\s+0$/m)
    expect(table.stdout).toContain("slots: 0 held of 1, 0 waiting")
    expect(asJson.code).toBe(0)
    expect(json(asJson)).toMatchObject({ status: "ok", plan: "free", slots: { limit: 1, held: 0 } })
    expect((json(asJson)["meters"] as Array<unknown>).length).toBe(4)
  })
})

describe("quota-coordinator holds", () => {
  it("lists pending holds oldest first; --state, --limit and more; --json is list_holds' result", async () => {
    const user = "cli-bea"
    for (const id of ["h-1", "h-2", "h-3"]) {
      expect((await client.reserve({ user, meter: "tokens", amount: 5, id })).status).toBe("reserved")
    }
    expect((await client.commit({ user, id: "h-1", amount: 4 })).status).toBe("committed")
    const [pending, limited, closed, all, asJson] = await Promise.all([
      cli(["holds", user]),
      cli(["holds", user, "--limit", "1"]),
      cli(["holds", user, "--state", "closed"]),
      cli(["holds", user, "--state=all", "--json"]),
      cli(["holds", user, "--limit=1", "--json"])
    ])
    expect(pending.code, pending.stderr).toBe(0)
    const rows = pending.stdout.split("\n").filter((line) => line.startsWith("h-"))
    expect(rows.map((line) => line.split(/\s+/)[0])).toEqual(["h-2", "h-3"])
    expect(pending.stdout).toMatch(/^id\s+meter\s+amount\s+consumed\s+state\s+created at\s+expires at$/m)
    expect(limited.code).toBe(0)
    expect(limited.stdout).toContain("1 shown, oldest first; more exist")
    expect(closed.stdout).toMatch(/^h-1\s+tokens\s+5\s+4\s+committed\s/m)
    expect(all.code).toBe(0)
    const listed = json(all) as { status: string; holds: Array<{ id: string; state: string }>; more: boolean }
    expect(listed.status).toBe("ok")
    expect(listed.more).toBe(false)
    expect(listed.holds.map((hold) => [hold.id, hold.state])).toEqual([
      ["h-1", "committed"],
      ["h-2", "pending"],
      ["h-3", "pending"]
    ])
    expect(Object.keys(listed.holds[0]!).sort()).toEqual(
      ["amount", "consumed", "createdAt", "expiresAt", "id", "meter", "state"].sort()
    )
    expect(json(asJson)).toMatchObject({ status: "ok", more: true })
    const empty = await cli(["holds", "cli-nobody"])
    expect(empty.code).toBe(0)
    expect(empty.stdout).toContain('user "cli-nobody" has no pending holds')
  })

  it("refuses a bad --state or --limit as a usage error (2) before sending anything", async () => {
    const [badState, badLimit, tooMany] = await Promise.all([
      cli(["holds", "cli-bea", "--state", "open"]),
      cli(["holds", "cli-bea", "--limit", "0"]),
      cli(["holds", "cli-bea", "--limit", "1001"])
    ])
    expect(badState.code).toBe(2)
    expect(badState.stderr).toContain("--state must be pending, closed or all")
    expect(badLimit.code).toBe(2)
    expect(tooMany.code).toBe(2)
    expect(badLimit.stderr).toContain("--limit must be an integer from 1 to 1000")
  })
})

describe("quota-coordinator holds and usage with ids a hostile service chose", () => {
  it("print escape sequences, C1 controls and bidi overrides escaped, never raw", async () => {
    const user = "cli-mallory"
    const id = "\u001b]0;owned\u0007\u001b[2J\u009b31mevil\u202egnp"
    const job = "job\r\u001b[1Afake\u2066"
    expect((await client.reserve({ user, meter: "tokens", amount: 5, id })).status).toBe("reserved")
    expect((await client.acquireSlot({ user, job })).status).toBe("acquired")
    const [holds, usage] = await Promise.all([cli(["holds", user]), cli(["usage", user])])
    // eslint-disable-next-line no-control-regex -- control characters are exactly what it is about
    const actedOn = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]/
    expect(holds.code, holds.stderr).toBe(0)
    expect(holds.stdout).not.toMatch(actedOn)
    expect(holds.stdout).toContain("\\u001b]0;owned\\u0007\\u001b[2J\\u009b31mevil\\u202egnp")
    expect(usage.code, usage.stderr).toBe(0)
    expect(usage.stdout).not.toMatch(actedOn)
    expect(usage.stdout).toContain("job\\u000d\\u001b[1Afake\\u2066")
  })
})

describe("quota-coordinator set-plan", () => {
  it("sets a plan (0) and refuses an unknown one (1)", async () => {
    const set = await cli(["set-plan", "cli-cy", "pro"])
    expect(set.code, set.stderr).toBe(0)
    expect(set.stdout).toBe('user "cli-cy": plan set to pro\n')
    expect((await client.getUsage({ user: "cli-cy" })) as { plan?: string }).toMatchObject({ plan: "pro" })
    const [unknown, unknownJson, asJson] = await Promise.all([
      cli(["set-plan", "cli-cy", "gold"]),
      cli(["set-plan", "cli-cy", "gold", "--json"]),
      cli(["set-plan", "cli-cy", "enterprise", "--json"])
    ])
    expect(unknown.code).toBe(1)
    expect(unknown.stdout).toBe("")
    expect(unknown.stderr).toContain('unknown_plan: the coordinator\'s configuration has no plan "gold"')
    expect(unknownJson.code).toBe(1)
    expect(json(unknownJson)).toEqual({ status: "unknown_plan" })
    expect(asJson.code).toBe(0)
    expect(json(asJson)).toEqual({ status: "ok" })
  })
})

describe("quota-coordinator set-limit", () => {
  it("sets a limit and returns it to the plan's default (0); an unknown meter is refused (1)", async () => {
    const user = "cli-dee"
    const set = await cli(["set-limit", user, "tokens", "1000"])
    expect(set.code, set.stderr).toBe(0)
    expect(set.stdout).toBe('user "cli-dee": tokens limit set to 1000\n')
    const usage = (await client.getUsage({ user })) as unknown as {
      meters: Array<{ meter: string; limit: number }>
    }
    expect(usage.meters.find((meter) => meter.meter === "tokens")?.limit).toBe(1000)
    const back = await cli(["set-limit", user, "tokens", "default", "--json"])
    expect(back.code).toBe(0)
    expect(json(back)).toEqual({ status: "ok" })
    const restored = (await client.getUsage({ user })) as unknown as {
      meters: Array<{ meter: string; limit: number }>
    }
    expect(restored.meters.find((meter) => meter.meter === "tokens")?.limit).toBe(400_000)
    const [unknownMeter, badAmount, badMeterName, missing] = await Promise.all([
      cli(["set-limit", user, "gpu_hours", "5"]),
      cli(["set-limit", user, "tokens", "lots"]),
      cli(["set-limit", user, "Tokens", "5"]),
      cli(["set-limit", user, "tokens"])
    ])
    expect(unknownMeter.code).toBe(1)
    expect(unknownMeter.stderr).toContain("unknown_meter")
    expect(badAmount.code).toBe(2)
    expect(badAmount.stderr).toContain("AMOUNT must be an integer from 0 to 2^53-1, or default")
    // The coordinator judges the meter name: invalid_request is the caller's mistake, a usage error.
    expect(badMeterName.code).toBe(2)
    expect(badMeterName.stderr).toContain("invalid_request: meter: must match")
    expect(missing.code).toBe(2)
    expect(missing.stderr).toContain("missing AMOUNT")
  })
})

describe("quota-coordinator release", () => {
  it("releases a pending hold (0), again is already released (0); unknown and committed holds are refused (1)", async () => {
    const user = "cli-eve"
    expect((await client.reserve({ user, meter: "tokens", amount: 9, id: "stuck" })).status).toBe("reserved")
    expect((await client.reserve({ user, meter: "tokens", amount: 2, id: "done" })).status).toBe("reserved")
    expect((await client.commit({ user, id: "done" })).status).toBe("committed")
    const released = await cli(["release", user, "stuck"])
    expect(released.code, released.stderr).toBe(0)
    expect(released.stdout).toContain(
      'hold "stuck" released (amount 9, consumed 0); tokens: used 2, reserved 0'
    )
    const [again, unknown, committed, asJson] = await Promise.all([
      cli(["release", user, "stuck"]),
      cli(["release", user, "never"]),
      cli(["release", user, "done"]),
      cli(["release", user, "stuck", "--json"])
    ])
    expect(again.code).toBe(0)
    expect(again.stdout).toContain("was already released")
    expect(unknown.code).toBe(1)
    expect(unknown.stderr).toContain('not_found: user "cli-eve" has no hold "never"')
    expect(committed.code).toBe(1)
    expect(committed.stderr).toContain("is already committed")
    expect(json(asJson)).toMatchObject({ status: "exists", id: "stuck", state: "released", meter: "tokens" })
  })
})

describe("usage and connection errors", () => {
  it("exits 2 when NATS cannot be reached, or nobody serves the prefix, naming why", async () => {
    const [unreachable, unserved] = await Promise.all([
      cli(["usage", "cli-ann"], { NATS_URL: "nats://127.0.0.1:1" }),
      cli(["usage", "cli-ann"], { QUOTA_PREFIX: randomPrefix("nobody") })
    ])
    expect(unreachable.code).toBe(2)
    expect(unreachable.stderr).toMatch(/quota-coordinator: .+/)
    expect(unserved.code).toBe(2)
    expect(unserved.stderr).toContain("no_responders")
  })

  it("exits 2 on an unknown option, a missing argument or an unknown command; --help is 0", async () => {
    const runs = await Promise.all([
      cli(["usage", "cli-ann", "--bogus"]),
      cli(["usage"]),
      cli(["set-plan", "only-user"]),
      cli(["frobnicate"]),
      cli([]),
      ...["usage", "holds", "set-plan", "set-limit", "release", "serve", "migrate", "demo"].map((name) =>
        cli([name, "--help"])
      )
    ])
    const [unknownOption, noUser, noPlan, unknownCommand, nothing, ...helps] = runs
    for (const ran of [unknownOption, noUser, noPlan, unknownCommand, nothing]) expect(ran!.code).toBe(2)
    expect(unknownOption!.stderr).toContain("--bogus")
    expect(noUser!.stderr).toContain("missing USER")
    for (const help of helps) {
      expect(help.code).toBe(0)
      expect(help.stdout).toContain("Usage: quota-coordinator")
    }
  })
})

describe("the program", () => {
  it("exits with the command line's code: 0 success, 1 refused, 2 usage error", async () => {
    const [success, refused, usage] = await Promise.all([
      program(["set-plan", "cli-fay", "pro"]),
      program(["set-plan", "cli-fay", "gold", "--json"]),
      program(["holds", "cli-fay", "--limit", "none"])
    ])
    expect(success.code, success.stderr).toBe(0)
    expect(success.stdout).toBe('user "cli-fay": plan set to pro\n')
    expect(refused.code).toBe(1)
    expect(JSON.parse(refused.stdout)).toEqual({ status: "unknown_plan" })
    expect(usage.code).toBe(2)
  })
})
