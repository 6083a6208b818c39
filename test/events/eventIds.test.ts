/**
 * Event ids (issues 34 and 36): `<database tag>-<token>-<position>-<index>`, read back by a starting
 * publisher as the same place in the log; another database's ids, or text that is no id, say nothing.
 */
import { describe, expect, it } from "vitest"
import { eventIdOf, eventPlaceOf } from "../../src/events/eventIds.js"

describe("event ids", () => {
  it("carry the row's token and position and the event's index, and read back to the same place", () => {
    for (const place of [
      { token: "0", position: 1, index: 1 },
      { token: "9f3a0c71d2e4b5a6", position: 45, index: 3 },
      { token: "ffffffffffffffff", position: Number.MAX_SAFE_INTEGER, index: 512 }
    ]) {
      const id = eventIdOf("mx08pbhs", place)
      expect(id).toBe(`mx08pbhs-${place.token}-${place.position}-${place.index}`)
      expect(eventPlaceOf("mx08pbhs", id)).toEqual(place)
    }
  })

  it("tell other ids apart", () => {
    for (const other of [
      "mx08pbhr-ab-7-1",
      "mx08pbhs-",
      "mx08pbhs-ab-7",
      "mx08pbhs-ab-07-1",
      "mx08pbhs-ab-7-0",
      "mx08pbhs-AB-7-1",
      "mx08pbhs-ab-7-1-2",
      "mx08pbhs-16-7",
      `mx08pbhs-ab-${2 ** 60}-1`
    ])
      expect(eventPlaceOf("mx08pbhs", other), other).toBeUndefined()
  })
})
