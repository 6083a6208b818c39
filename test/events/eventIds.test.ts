/**
 * Event ids (issue 34): `<database tag>-<incarnation>-<seq>`, read back by the publisher's skip rule as
 * the same incarnation and seq; ids of rows recorded before incarnations (`<database tag>-<seq>`) keep
 * their shape; another database's ids, or text that is no id, say nothing.
 */
import { describe, expect, it } from "vitest"
import { eventIdOf, outboxPositionOf } from "../../src/events/Outbox.js"
import { incarnationText } from "../../src/store/postgres/incarnation.js"

describe("event ids", () => {
  it("carry the incarnation as an unsigned base-36 number, and read back to the same position", () => {
    // hashtextextended gives any int8: the negatives too are ids of their own.
    const incarnations = ["-9223372036854775808", "-1", "0", "42", "9223372036854775807"].map(incarnationText)
    expect(incarnations).toEqual(["1y2p0ij32e8e8", "3w5e11264sgsf", "0", "16", "1y2p0ij32e8e7"])
    for (const incarnation of incarnations) {
      const id = eventIdOf("mx08pbhs", { incarnation, seq: 45 })
      expect(id).toBe(`mx08pbhs-${incarnation}-45`)
      expect(outboxPositionOf("mx08pbhs", id)).toEqual({ incarnation, seq: 45 })
    }
  })

  it("keep the shape of rows recorded before incarnations, and tell other ids apart", () => {
    expect(incarnationText(null)).toBe("")
    expect(eventIdOf("mx08pbhs", { incarnation: "", seq: 7 })).toBe("mx08pbhs-7")
    expect(outboxPositionOf("mx08pbhs", "mx08pbhs-7")).toEqual({ incarnation: "", seq: 7 })
    for (const other of [
      "mx08pbhr-16-7",
      "mx08pbhs-",
      "mx08pbhs-16-",
      "mx08pbhs-16-07",
      "mx08pbhs-a-b-7",
      "mx08pbhs-1x"
    ])
      expect(outboxPositionOf("mx08pbhs", other), other).toBeUndefined()
  })
})
