/** One user's stored rows through the store's batch load (what a partition actor asks for many at once). */
import { Effect } from "effect"
import type { StoredUser } from "../../src/domain/events.js"
import type { StoreShape, StoreUnavailable } from "../../src/store/Store.js"

export const loadUser = (
  store: Pick<StoreShape, "loadUsers">,
  user: string,
  now: number
): Effect.Effect<StoredUser, StoreUnavailable> =>
  Effect.map(store.loadUsers([user], now), (loaded) => loaded.get(user)!)
