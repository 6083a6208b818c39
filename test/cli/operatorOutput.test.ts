/**
 * The operator's terminal is not the callers': users, hold ids and jobs are chosen by whichever
 * service sent them, and `holds` / `usage` print them. Whatever they hold, a table or sentence prints
 * no character a terminal acts on (C0 and C1 controls, DEL, bidi controls, line separators): each is
 * shown as its `\uXXXX` escape, one row per hold. `--json` stays the exact value (escaped as JSON).
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { operatorRequest, outcomeOf } from "../../src/cli/operator.js"
import type { HoldListResult, Result, UsageResult } from "../../src/domain/results.js"

/** Every character the output must never carry raw (LF only as the end of a line of ours). */
// eslint-disable-next-line no-control-regex -- control characters are exactly what it is about
const actedOn = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]/

/** Escape sequences a hostile service would send: clear screen, window title, CSI as C1, bidi override. */
const hostile = {
  clear: "\u001b[2J\u001b[H",
  title: "\u001b]0;owned\u0007",
  csi: "\u009b31m",
  override: "evil\u202egnp.exe",
  rewrite: "ok\rFAKE\nsecond line",
  del: "a\u007fb"
}

const at = Date.UTC(2026, 10, 26)

const holdList = (ids: ReadonlyArray<string>): HoldListResult => ({
  status: "ok",
  holds: ids.map((id) => ({
    id,
    meter: "tokens",
    amount: 5,
    consumed: 0,
    state: "pending",
    expiresAt: at + 3_600_000,
    createdAt: at
  })),
  more: false
})

const usage = (jobs: ReadonlyArray<string>): UsageResult => ({
  status: "ok",
  plan: "free",
  meters: [
    {
      meter: "tokens",
      period: "month",
      periodStart: at,
      limit: 400_000,
      used: 0,
      reserved: 0,
      available: 400_000,
      overage: 0,
      pendingHolds: 0
    }
  ],
  slots: {
    limit: 1,
    held: jobs.length,
    jobs: jobs.map((job) => ({ job, leaseExpiresAt: at + 120_000 })),
    waiting: 0
  }
})

const printed = (subcommand: string, args: ReadonlyArray<string>, result: Result, json = false) =>
  outcomeOf(operatorRequest(subcommand, args, {}), result, json)

describe("operator output: caller-chosen text is inert on a terminal", () => {
  it("holds prints each hostile id escaped, one row per hold", () => {
    const ids = Object.values(hostile)
    const { stdout, code } = printed("holds", ["u"], holdList(ids))
    expect(code).toBe(0)
    expect(stdout).not.toMatch(actedOn)
    // Header and one line per hold: an id's own CR/LF cannot forge rows.
    expect(stdout.trimEnd().split("\n")).toHaveLength(1 + ids.length)
    expect(stdout).toContain("\\u001b[2J\\u001b[H")
    expect(stdout).toContain("\\u001b]0;owned\\u0007")
    expect(stdout).toContain("\\u009b31m")
    expect(stdout).toContain("evil\\u202egnp.exe")
    expect(stdout).toContain("ok\\u000dFAKE\\u000asecond line")
    expect(stdout).toContain("a\\u007fb")
  })

  it("usage prints hostile jobs and a hostile user escaped", () => {
    const user = `${hostile.csi}${hostile.override}`
    const { stdout } = printed("usage", [user], usage(Object.values(hostile)))
    expect(stdout).not.toMatch(actedOn)
    expect(stdout).toContain('user "\\u009b31mevil\\u202egnp.exe", plan free')
    expect(stdout).toContain("\\u001b]0;owned\\u0007")
  })

  it("refusals name the hostile id escaped (on stderr)", () => {
    const id = `${hostile.title}${hostile.csi}${hostile.override}`
    const { stderr, code } = printed("release", ["u", id], { status: "not_found" })
    expect(code).toBe(1)
    expect(stderr).not.toMatch(actedOn)
    expect(stderr).toContain('no hold "\\u001b]0;owned\\u0007\\u009b31mevil\\u202egnp.exe"')
  })

  it("--json is the exact value, with DEL, C1 and bidi controls escaped as JSON too", () => {
    const ids = Object.values(hostile)
    const { stdout } = printed("holds", ["u"], holdList(ids), true)
    expect(stdout).not.toMatch(actedOn)
    expect(JSON.parse(stdout)).toEqual(holdList(ids))
  })

  it("any id, job or user: no character a terminal acts on, the JSON exact", () => {
    const text = fc.string({ unit: "binary", minLength: 1, maxLength: 40 })
    fc.assert(
      fc.property(fc.array(text, { minLength: 1, maxLength: 5 }), text, (ids, user) => {
        const holds = printed("holds", [user], holdList(ids))
        expect(holds.stdout).not.toMatch(actedOn)
        expect(holds.stdout.trimEnd().split("\n")).toHaveLength(1 + ids.length)
        const jobs = printed("usage", [user], usage(ids))
        expect(jobs.stdout).not.toMatch(actedOn)
        const asJson = printed("holds", [user], holdList(ids), true)
        expect(asJson.stdout).not.toMatch(actedOn)
        expect(JSON.parse(asJson.stdout)).toEqual(holdList(ids))
      }),
      { numRuns: 500 }
    )
  })
})
