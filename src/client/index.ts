/** The public API of the quota-coordinator client (the package's main export). */
export { QuotaClient } from "./QuotaClient.js"
export type { QuotaClientConnectOptions, QuotaClientEffects } from "./QuotaClient.js"
export type { QuotaClientOptions, RetryPolicy } from "./options.js"
export { retryDelayMs } from "./options.js"
export type { ClientCounters } from "./CommandDispatcher.js"
export {
  CoordinatorDisagrees,
  DiscoveryFailed,
  HoldNotCommitted,
  HoldNotGranted,
  LimitReached,
  QuotaClientClosed,
  QuotaRetriesExhausted,
  QuotaServiceError,
  QuotaTransportError,
  SlotBusy,
  SlotLeaseLost,
  SlotNotGranted,
  SlotWaitAborted,
  UsageListRefused
} from "./errors.js"
export type { QuotaClientError, RetryReason } from "./errors.js"
/** What `QuotaClient.connect` rejects with: a setting or file that cannot be used, or a refused connection. */
export { SettingsInvalid } from "../config/SettingsInvalid.js"
export { NatsConnectFailed } from "../transport/errors.js"
export type * from "./types.js"
export type { HoldInput, HoldWork, HoldWorkDone, HoldWorkOutcome } from "./withHold.js"
export type { CoordinatorInfo } from "./subjectSettings.js"
export { discoverCoordinators } from "./subjectSettings.js"
export type { AcquireSlotOptions, SlotInput, SlotWork } from "./withSlot.js"
export type {
  EventDelivery,
  EventsOptions,
  EventSubscription,
  QuotaEventMessage,
  UsageRecordedEvent
} from "./events.js"
export type { QuotaEvent, QuotaEventKind } from "../domain/events.js"
export { quotaEventKinds } from "../domain/events.js"
export { partitionOf } from "../domain/partition.js"
export type * from "../domain/results.js"
