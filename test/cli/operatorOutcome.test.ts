/**
 * The operator's exit code and message for each kind of answer, without a coordinator: `limit_reached`
 * (PROTOCOL.md revision 1.2) is a refusal by the coordinator, exit 1, like `not_found`; only
 * `invalid_request` and `wrong_partition` say the call itself was wrong (2).
 */
import { describe, expect, it } from "vitest"
import { exitCode, operatorRequest, outcomeOf } from "../../src/cli/operator.js"

describe("operator outcomes", () => {
  const release = operatorRequest("release", ["u", "h"], {})

  it("limit_reached is a refusal (1), naming the bound and its value", () => {
    const outcome = outcomeOf(
      release,
      { status: "limit_reached", bound: "pending_holds", max: 10_000 },
      false
    )
    expect(outcome.code).toBe(exitCode.refused)
    expect(outcome.stdout).toBe("")
    expect(outcome.stderr).toContain("pending_holds")
    expect(outcome.stderr).toContain("10000")
  })

  it("with --json the result is printed as it came, still exit 1", () => {
    const result = { status: "limit_reached", bound: "slots", max: 1_000 } as const
    const outcome = outcomeOf(release, result, true)
    expect(outcome.code).toBe(exitCode.refused)
    expect(JSON.parse(outcome.stdout)).toEqual(result)
  })

  it("invalid_request stays a usage error (2), not_found a refusal (1)", () => {
    expect(outcomeOf(release, { status: "invalid_request", error: "id: empty" }, false).code).toBe(
      exitCode.usage
    )
    expect(outcomeOf(release, { status: "not_found" }, false).code).toBe(exitCode.refused)
  })
})
