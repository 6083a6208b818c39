/**
 * `withSlot`: run a piece of work in one of the user's fairness slots. The slot's lease is renewed
 * while the work runs, so long work keeps its slot, and released afterwards, so the next waiter gets it
 * at once instead of when the lease runs out.
 */
import { slotLeaseMsDefault } from "../domain/limits.js"
import { LimitReached, SlotBusy, SlotLeaseLost, SlotNotGranted } from "./errors.js"
import type {
  AcquireSlotInput,
  GrantedSlot,
  ReleaseSlotInput,
  RenewSlotInput,
  SlotCommandResult
} from "./types.js"

export interface SlotInput extends AcquireSlotInput {
  /** How often the lease is renewed while the work runs; default a third of the lease. */
  readonly renewEveryMs?: number
  /**
   * Cancels the job: while waiting for a slot, the wait is withdrawn and `withSlot` rejects with
   * `SlotWaitAborted` (the slot goes to the next waiter); while the work runs, the work's signal aborts.
   */
  readonly signal?: AbortSignal
}

export interface AcquireSlotOptions {
  /** Withdraws the wait when it aborts: see `QuotaClient.acquireSlot`. */
  readonly signal?: AbortSignal
}

/**
 * `signal` aborts with `SlotLeaseLost` if a renewal finds the lease gone (the slot may be another job's
 * now), or with the reason of `SlotInput.signal` when the caller cancels the job.
 */
export type SlotWork<W> = (slot: GrantedSlot, signal: AbortSignal) => Promise<W>

/** The operations `withSlot` needs; `QuotaClient` has them. */
export interface SlotOperations {
  acquireSlot(input: AcquireSlotInput, options?: AcquireSlotOptions): Promise<SlotCommandResult>
  renewSlot(input: RenewSlotInput): Promise<SlotCommandResult>
  releaseSlot(input: ReleaseSlotInput): Promise<SlotCommandResult>
}

/** Renews one slot's lease every `intervalMs` until stopped; one renewal at a time. */
class LeaseRenewal {
  readonly controller = new AbortController()
  private timer: ReturnType<typeof setTimeout> | undefined
  private renewing: Promise<void> = Promise.resolve()
  private stopped = false

  constructor(
    private readonly client: SlotOperations,
    private readonly renew: RenewSlotInput,
    private readonly intervalMs: number
  ) {}

  start(): void {
    if (this.stopped || this.controller.signal.aborted) return
    this.timer = setTimeout(() => {
      this.renewing = this.renewOnce().finally(() => this.start())
    }, this.intervalMs)
  }

  /** Stops renewing and waits for a renewal in flight, so it cannot land after the release. */
  async stop(): Promise<void> {
    this.stopped = true
    clearTimeout(this.timer)
    await this.renewing
  }

  private async renewOnce(): Promise<void> {
    try {
      const renewed = await this.client.renewSlot(this.renew)
      if (renewed.status === "not_found") {
        this.controller.abort(new SlotLeaseLost({ user: this.renew.user, job: this.renew.job }))
      }
    } catch {
      // Retries are exhausted but the lease may still stand (it lasts three intervals): try again at
      // the next interval; a lease that did end answers `not_found` then.
    }
  }
}

/**
 * Throws `SlotBusy` (with `retryAfterMs`) when no slot came free within `waitMs`, `LimitReached` (with
 * `bound` and `max`) on `limit_reached`, `SlotNotGranted` on any other refusal, `SlotWaitAborted` when
 * `signal` aborts before the slot is granted, and the work's own error after releasing the slot when
 * the work throws.
 */
export const withSlot = async <W>(
  client: SlotOperations,
  input: SlotInput,
  work: SlotWork<W>
): Promise<W> => {
  const { renewEveryMs, signal, ...acquire } = input
  const { user, job, leaseMs } = input
  const slot = await client.acquireSlot(acquire, signal === undefined ? {} : { signal })
  if (slot.status === "busy") {
    throw new SlotBusy({ user, job, result: slot, retryAfterMs: slot.retryAfterMs ?? 0 })
  }
  if (slot.status === "limit_reached") {
    throw new LimitReached({ op: "acquire_slot", user, job, bound: slot.bound, max: slot.max, result: slot })
  }
  if (slot.status !== "acquired" && slot.status !== "exists")
    throw new SlotNotGranted({ user, job, result: slot })
  const renewal = new LeaseRenewal(
    client,
    leaseMs === undefined ? { user, job } : { user, job, leaseMs },
    renewEveryMs ?? Math.floor((leaseMs ?? slotLeaseMsDefault) / 3)
  )
  renewal.start()
  let value: W
  try {
    const workSignal =
      signal === undefined ? renewal.controller.signal : AbortSignal.any([signal, renewal.controller.signal])
    value = await work(slot, workSignal)
  } catch (error) {
    await renewal.stop()
    // The work's error is what the caller needs; an unreleased slot is freed when its lease ends.
    await client.releaseSlot({ user, job }).catch(() => undefined)
    throw error
  }
  await renewal.stop()
  await client.releaseSlot({ user, job })
  return value
}
