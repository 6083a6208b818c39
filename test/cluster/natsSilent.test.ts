/**
 * One of three processes cut off from NATS in silent mode for about 15 s under load (issues 22 and 26):
 * natsFaults.ts says what is done and checked.
 */
import { afterAll, beforeAll, describe, it } from "vitest"
import type { NatsFaultWorld } from "./natsFaults.js"
import { closeWorld, openWorld, runNatsFault, unservedBoundMs } from "./natsFaults.js"

describe("cluster: one process's NATS connection silent both ways (nothing closed) under load", () => {
  let world: NatsFaultWorld | undefined

  beforeAll(async () => {
    world = await openWorld("natssilent")
  })

  afterAll(async () => {
    await closeWorld(world)
  })

  it(`has its partitions served by the others within ${unservedBoundMs.silent} ms, no wrong answer, serves again within 5 s of the mend`, async () => {
    await runNatsFault(world!, "silent")
  }, 120_000)
})
