/**
 * Every reply of the nemesis's load judged against the per-user model (model.ts): its status against
 * its flow's history and the clocks' bound (a hold that cannot have expired answered `closed`, one that
 * must have expired answered `committed`, a granted hold `not_found`...), and every figure it carries
 * (`used`, `reserved`, `pendingHolds`, `limit`, slots `held`, the holds and jobs listed, the period)
 * against what the user's other calls allow. Refusals (`insufficient_quota`, `busy`) and reads
 * (`get_usage`, `list_holds`) are judged as grants are: a refusal must rest on a state that was possible.
 *
 * A call is judged once every call of its user sent before its reply has answered (or failed), so that
 * the model knows what each of them did.
 */
import { meter } from "../cluster/cluster.js"
import type { Call, Reply } from "./history.js"
import { endOf, numberOf } from "./history.js"
import type { Window } from "./model.js"
import { holdAt, periodsOf, reservedBounds, slotAt, usedBounds, windowOf } from "./model.js"
import { judgeHoldList, judgeUsage } from "./judgeReads.js"
import type { UserView } from "./view.js"
import { judgeUsedReserved, within } from "./view.js"

export { userView } from "./view.js"

/** Whether every call of the user sent before `call`'s reply has answered or failed. */
export const readyToJudge = (call: Call, userCalls: ReadonlyArray<Call>): boolean =>
  call.reply !== undefined &&
  userCalls.every((other) => other.sentAt >= endOf(call) || other.repliedAt !== undefined)

/** What is wrong with one reply (empty: nothing). */
export const judgeCall = (call: Call, view: UserView): Array<string> => {
  const reply = call.reply
  if (reply === undefined) return []
  const problems: Array<string> = []
  const at = windowOf(call)
  switch (call.op) {
    case "set_limit":
      if (reply.status !== "ok") problems.push(`set_limit answered ${reply.status}`)
      break
    case "reserve":
    case "consume":
    case "extend":
    case "commit":
    case "release":
      problems.push(...judgeHoldStep(call, reply, view, at))
      if (hasMeterView(reply)) problems.push(...judgeMeterView(reply, view, at, call))
      break
    case "acquire_slot":
    case "renew_slot":
    case "release_slot":
      problems.push(...judgeSlotStep(call, reply, view, at))
      break
    case "get_usage":
      problems.push(...judgeUsage(reply, view, at))
      break
    case "list_holds":
      problems.push(...judgeHoldList(reply, view, at))
      break
  }
  return problems
}

const hasMeterView = (reply: Reply): boolean => typeof reply["used"] === "number"

/** The state of the user's meter a reply carries, after its decision. */
const judgeMeterView = (reply: Reply, view: UserView, at: Window, call: Call): Array<string> => {
  const problems: Array<string> = []
  const used = numberOf(reply, "used")
  const reserved = numberOf(reply, "reserved")
  const limit = numberOf(reply, "limit")
  if (reply["meter"] !== meter) problems.push(`meter ${String(reply["meter"])}`)
  if (view.limit !== undefined && limit !== view.limit) problems.push(`limit ${limit}, set to ${view.limit}`)
  if (numberOf(reply, "available") !== limit - used - reserved)
    problems.push(`available ${numberOf(reply, "available")} is not limit - used - reserved`)
  // Nothing in this load goes over a limit: no usage beyond a hold, no adjust, no lowered limit.
  if (used + reserved > limit || numberOf(reply, "overage") !== 0)
    problems.push(
      `used ${used} + reserved ${reserved} against limit ${limit} (overage ${numberOf(reply, "overage")})`
    )
  const own =
    call.op === "reserve" && ["reserved", "exists"].includes(reply.status)
      ? view.holds.get(call.flow)
      : undefined
  problems.push(...judgeUsedReserved(used, reserved, undefined, view, at, own))
  if (own !== undefined && view.limit !== undefined) {
    // The grant against what certainly stood when it was asked for, in whichever period it fell.
    const clockMs = view.settings.clockOffsetMaxMs
    const usedMin = Math.min(
      ...periodsOf(view.calls, at, view.settings).map(
        (period) => usedBounds(view.calls, view.changes, at, period, view.settings).min
      )
    )
    const { reservedMin } = reservedBounds(view.holds, at, clockMs)
    if (usedMin + reservedMin + own.amount > view.limit)
      problems.push(
        `over-grant: ${own.amount} granted with at least ${usedMin} used and ${reservedMin} reserved of ${view.limit}`
      )
  }
  return problems
}

/** A hold step's status against its flow and the clocks: expiry neither early nor missed. */
const judgeHoldStep = (call: Call, reply: Reply, view: UserView, at: Window): Array<string> => {
  const flow = view.holds.get(call.flow)
  if (flow === undefined) return [`no reserve of ${call.flow} before it`]
  const clockMs = view.settings.clockOffsetMaxMs
  const hold = holdAt(flow, at, clockMs, call)
  const status = reply.status
  const state = reply["state"]
  const problems: Array<string> = []
  const expiredEarly = () =>
    state === "expired" && !hold.possiblyExpired
      ? [`answered expired, but it expires at ${hold.expiresLo} + 2 x ${clockMs} ms on a serving clock`]
      : []
  if (
    typeof reply["id"] === "string" &&
    (reply["id"] !== flow.id || numberOf(reply, "amount") !== flow.amount)
  )
    problems.push(
      `the hold shown is ${String(reply["id"])} of ${numberOf(reply, "amount")}, not ${flow.id} of ${flow.amount}`
    )
  if (status === "not_found") {
    if (hold.certainlyExists) problems.push("a hold granted before answered not_found")
    return problems
  }
  if (status === "closed" && call.op === "reserve") {
    // An earlier attempt of this reserve made the hold, and it expired before a later one asked again.
    const expiresAt = numberOf(reply, "expiresAt")
    const ttlMs = Number(call.input["ttlMs"])
    if (state !== "expired")
      problems.push(`closed (${String(state)}): only expiry closes a hold nobody else knows`)
    else if (!(expiresAt >= at.s - clockMs + ttlMs && at.r >= expiresAt + clockMs))
      problems.push(
        `answered expired at +${at.r - expiresAt} ms past its expiresAt ${expiresAt}, set ${ttlMs} ms after the call began`
      )
    return problems
  }
  if (status === "closed") {
    if (state === "expired") return [...problems, ...expiredEarly()]
    if (!hold.possiblyClosed) problems.push(`closed (${String(state)}) though nothing closed it`)
    return problems
  }
  const expected: Record<string, ReadonlyArray<string>> = {
    reserve: ["reserved", "exists", "insufficient_quota"],
    consume: ["consumed", "exists"],
    extend: ["extended"],
    commit: ["committed", "exists"],
    release: ["released", "exists"]
  }
  if (!expected[call.op]!.includes(status)) return [...problems, `answered ${status}`]
  if (status === "insufficient_quota") {
    if (numberOf(reply, "requested") !== flow.amount)
      problems.push(`requested ${numberOf(reply, "requested")}`)
    if (numberOf(reply, "available") >= flow.amount)
      problems.push(`refused with ${numberOf(reply, "available")} available`)
    return problems
  }
  // A step that acted on a pending hold: it must not have been closed already, whatever the clocks.
  if (call.op !== "reserve" && hold.certainlyClosed)
    problems.push(
      `acted on a hold already closed (expires at ${hold.expiresHi}: past its expiry + 3 x ${clockMs} ms when sent, or committed or released before)`
    )
  const wanted = call.op === "commit" ? "committed" : call.op === "release" ? "released" : "pending"
  // A consume's key applied in an earlier attempt answers `exists` even once the hold closed.
  const closedSince = call.op === "consume" && status === "exists" && hold.possiblyClosed
  if (state !== wanted && !(closedSince && (state !== "expired" || hold.possiblyExpired)))
    problems.push(`state ${String(state)}, not ${wanted}`)
  const consumed = numberOf(reply, "consumed")
  if (call.op === "commit") {
    if (consumed !== flow.amount) problems.push(`consumed ${consumed} after a commit of ${flow.amount}`)
  } else {
    // Its own part counts in a consume's reply (the hold's state leaves the judged call out).
    const own = call.op === "consume" ? Number(call.input["amount"]) : 0
    problems.push(...within("consumed", consumed, hold.consumedMin + own, hold.consumedMax + own))
  }
  const expiresAt = numberOf(reply, "expiresAt")
  const ttlMs = Number(call.input["ttlMs"])
  if (call.op === "extend" || call.op === "reserve") {
    // Set on the deciding clock, within B of the world's, during the call.
    if (!(expiresAt >= at.s - clockMs + ttlMs && expiresAt <= at.r + clockMs + ttlMs))
      problems.push(`expiresAt ${expiresAt} not within ${ttlMs} ms of the call, give or take ${clockMs} ms`)
  } else if (call.op === "consume" && !(expiresAt >= hold.expiresLo && expiresAt <= hold.expiresHi))
    problems.push(`expiresAt ${expiresAt}, the model allows ${hold.expiresLo}..${hold.expiresHi}`)
  return problems
}

/** A slot step: grants within the plan's slots, refusals only when they were all taken, leases honest. */
const judgeSlotStep = (call: Call, reply: Reply, view: UserView, at: Window): Array<string> => {
  const flow = view.slots.get(call.flow)
  if (flow === undefined) return [`no acquire of ${call.flow} before it`]
  const clockMs = view.settings.clockOffsetMaxMs
  const limit = view.settings.slotLimit
  const status = reply.status
  const problems: Array<string> = []
  const others = [...view.slots.values()].filter((other) => other.job !== flow.job)
  const heldMin = others.filter((other) => slotAt(other, at, clockMs).certainlyHeld).length
  const heldMax = others.filter((other) => slotAt(other, at, clockMs).possiblyHeld).length
  const held = numberOf(reply, "held")
  if (numberOf(reply, "limit") !== limit)
    problems.push(`slot limit ${numberOf(reply, "limit")}, not ${limit}`)
  const slot = slotAt(flow, at, clockMs, call)
  const leaseMs = Number(call.input["leaseMs"])
  const leaseHonest = () => {
    const lease = numberOf(reply, "leaseExpiresAt")
    return lease >= at.s - clockMs + leaseMs && lease <= at.r + clockMs + leaseMs
      ? []
      : [`leaseExpiresAt ${lease} not within ${leaseMs} ms of the call, give or take ${clockMs} ms`]
  }
  switch (`${call.op} ${status}`) {
    case "acquire_slot acquired":
    case "acquire_slot exists":
      if (heldMin + 1 > limit)
        problems.push(`granted while ${heldMin} other slots were certainly held (limit ${limit})`)
      problems.push(...within("held", held, heldMin + 1, heldMax + 1), ...leaseHonest())
      break
    case "acquire_slot busy":
      if (held < limit) problems.push(`busy with ${held} held of ${limit}`)
      if (heldMax < limit) problems.push(`busy, but at most ${heldMax} other slots can have been held`)
      problems.push(...within("held", held, heldMin, heldMax))
      break
    case "renew_slot renewed":
      if (slot.certainlyEnded) problems.push("renewed a slot already released or past its lease + 3 x B")
      problems.push(...leaseHonest())
      break
    case "renew_slot not_found":
      if (!slot.possiblyEnded)
        problems.push(`not_found, but its lease (to ${slot.leaseLo}) cannot have ended`)
      break
    case "release_slot released":
      if (slot.certainlyEnded) problems.push("released a slot already released or past its lease + 3 x B")
      break
    // `not_found` may answer a retry whose first attempt released it: judged against Postgres at the end.
    case "release_slot not_found":
      break
    default:
      problems.push(`answered ${status}`)
  }
  return problems
}
