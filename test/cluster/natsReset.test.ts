/**
 * One of three processes cut off from NATS in reset mode for 20 s under load (issue 22): natsFaults.ts
 * says what is done and checked.
 */
import { afterAll, beforeAll, describe, it } from "vitest"
import type { NatsFaultWorld } from "./natsFaults.js"
import { closeWorld, openWorld, runNatsFault, unservedBoundMs } from "./natsFaults.js"

describe("cluster: one process's NATS connection reset (new ones refused) under load", () => {
  let world: NatsFaultWorld | undefined

  beforeAll(async () => {
    world = await openWorld("natsreset")
  })

  afterAll(async () => {
    await closeWorld(world)
  })

  it(`has its partitions served by the others within ${unservedBoundMs.reset} ms, no wrong answer, serves again once mended`, async () => {
    await runNatsFault(world!, "reset")
  }, 120_000)
})
