/**
 * Event ids (Nats-Msg-Id): `<database tag>-<token>-<position>-<index>`. The log row's position and the
 * event's index in it (from 1) place the event in its partition's log; the token is the claim token of
 * the actor that appended the row (random, drawn when it began to serve the partition), so an id is
 * never handed out twice, though positions are after a promotion of a standby that lacked the tail, or
 * a restore from a backup. The database tag (its settings' creation time) keeps a database made anew
 * behind the same stream from having its first events taken for duplicates. Stable: a re-publish after
 * a crash or a hand-off carries the same id, and the stream's duplicate window keeps one copy.
 */

export interface EventPlace {
  readonly token: string
  readonly position: number
  readonly index: number
}

export const eventIdOf = (databaseTag: string, place: EventPlace): string =>
  `${databaseTag}-${place.token}-${place.position}-${place.index}`

/** Where an event id of this database stands; undefined for another database's or another shape's. */
export const eventPlaceOf = (databaseTag: string, eventId: string): EventPlace | undefined => {
  const tagged = `${databaseTag}-`
  if (!eventId.startsWith(tagged)) return undefined
  const parts = eventId.slice(tagged.length).split("-")
  if (parts.length !== 3) return undefined
  const [token, positionText, indexText] = parts as [string, string, string]
  if (!/^[0-9a-f]+$/.test(token) || !/^[1-9][0-9]*$/.test(positionText) || !/^[1-9][0-9]*$/.test(indexText))
    return undefined
  const position = Number(positionText)
  const index = Number(indexText)
  if (!Number.isSafeInteger(position) || !Number.isSafeInteger(index)) return undefined
  return { token, position, index }
}
