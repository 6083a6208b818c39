/**
 * A real coordinator (memory store) behind the real NATS transport on the nats-server at 127.0.0.1:4222,
 * under a random prefix per test file so files run in parallel, and a plain nats.js client to call it.
 */
import { randomUUID } from "node:crypto"
import { Writable } from "node:stream"
import { connect } from "@nats-io/transport-node"
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import type { Coordinator, CoordinatorOptions } from "../../src/actors/Coordinator.js"
import { coordinatorLayer } from "../../src/actors/Coordinator.js"
import type { Config } from "../../src/domain/config.js"
import { defaultConfig } from "../../src/domain/config.js"
import { partitionOf } from "../../src/domain/partition.js"
import type { MemoryStore } from "../../src/store/MemoryStore.js"
import { memoryStoreLayer } from "../../src/store/MemoryStore.js"
import type { NatsServerOptions, NatsServerShape } from "../../src/transport/NatsServer.js"
import { NatsServer, natsServerLayer } from "../../src/transport/NatsServer.js"
import { makeLogger } from "../../src/transport/log.js"

export const natsUrl = "nats://127.0.0.1:4222"

/** Unique per test file and run, so parallel files never share subjects. */
export const randomPrefix = (label: string): string => `qt${label}${randomUUID().slice(0, 8)}`

/** Log lines the server wrote, parsed. */
export class LogLines {
  readonly lines: Array<Record<string, unknown>> = []
  readonly stream = new Writable({
    write: (chunk: Buffer, _encoding, done) => {
      for (const line of chunk.toString("utf8").split("\n")) {
        if (line.trim() !== "") this.lines.push(JSON.parse(line) as Record<string, unknown>)
      }
      done()
    }
  })
}

export interface Harness {
  readonly prefix: string
  readonly partitions: number
  readonly server: NatsServerShape
  readonly client: NatsConnection
  readonly logs: LogLines
  readonly subject: (user: string, kind?: "ops" | "admin") => string
  /** Sends a raw body, returns the reply's headers and parsed JSON (undefined for an empty body). */
  readonly request: (subject: string, body: string | Uint8Array) => Promise<Reply>
  /** Sends one command or a batch to the user's partition's subject. */
  readonly call: (user: string, body: unknown, kind?: "ops" | "admin") => Promise<unknown>
  readonly close: () => Promise<void>
}

export interface Reply {
  readonly headers: MsgHdrs | undefined
  readonly body: unknown
  readonly bytes: number
}

export interface HarnessOptions {
  readonly label: string
  readonly partitions?: number
  readonly config?: Config
  readonly server?: Partial<NatsServerOptions>
  readonly coordinator?: Partial<CoordinatorOptions>
  readonly store?: MemoryStore
  /** Replaces the real coordinator (fault injection: a coordinator that dies). */
  readonly coordinatorLayer?: Layer.Layer<Coordinator>
}

export const startHarness = async (options: HarnessOptions): Promise<Harness> => {
  const prefix = randomPrefix(options.label)
  const partitions = options.partitions ?? 8
  const logs = new LogLines()
  const layer = natsServerLayer({
    servers: natsUrl,
    prefix,
    partitions,
    logger: makeLogger("debug", logs.stream),
    ...options.server
  }).pipe(
    Layer.provide(
      options.coordinatorLayer ??
        coordinatorLayer({
          config: options.config ?? defaultConfig,
          assertFull: true,
          partitions,
          ...options.coordinator
        }).pipe(Layer.provide(memoryStoreLayer(options.store)))
    )
  )
  const scope = Effect.runSync(Scope.make())
  const context = await Effect.runPromise(Layer.buildWithScope(layer, scope))
  const server = Context.get(context, NatsServer)
  const client = await connect({ servers: natsUrl })
  const subject = (user: string, kind: "ops" | "admin" = "ops") =>
    `${prefix}.v1.${partitionOf(user, partitions)}.${kind}`
  const request = async (subjectName: string, body: string | Uint8Array): Promise<Reply> => {
    const msg = await client.request(subjectName, body, { timeout: 10_000 })
    return {
      headers: msg.headers,
      body: msg.data.length === 0 ? undefined : msg.json(),
      bytes: msg.data.length
    }
  }
  return {
    prefix,
    partitions,
    server,
    client,
    logs,
    subject,
    request,
    call: async (user, body, kind = "ops") => (await request(subject(user, kind), JSON.stringify(body))).body,
    close: async () => {
      await client.close()
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  }
}
