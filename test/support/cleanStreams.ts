/** Vitest global setup: deletes the events streams earlier test and bench runs left behind (eventStreams.ts). */
import { deleteLeftoverStreams } from "./eventStreams.js"

export default async function cleanStreams(): Promise<void> {
  await deleteLeftoverStreams(process.env["NATS_URL"] ?? "nats://127.0.0.1:4222")
}
