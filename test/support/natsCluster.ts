/**
 * A NATS cluster for tests: `size` nats-server processes on free loopback ports, each in a temporary
 * directory of its own, routed to each other (full mesh), with clustered JetStream (each node needs a
 * `server_name`; the cluster needs a `name`). The configuration is the shape of deploy/nats/cluster/.
 * Never the shared NATS on 4222.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import type { NatsServerProcess } from "./natsServerProcess.js"
import { freeLoopbackPort, startNatsServer } from "./natsServerProcess.js"

export interface NatsClusterNode {
  readonly name: string
  readonly server: NatsServerProcess
  /** Its monitoring endpoint (/connz, /jsz, /routez). */
  readonly monitorPort: number
}

export interface NatsCluster {
  readonly nodes: ReadonlyArray<NatsClusterNode>
  /** Every node's client URL, comma-separated (NATS_URL, QuotaClient's `servers`). */
  readonly urls: string
  /** Stops every node still running and deletes the directories. */
  readonly stop: () => Promise<void>
}

/** A node's configuration (the shape of deploy/nats/cluster/nats-1.conf, on loopback ports). */
export const clusterNodeConfig = (options: {
  readonly name: string
  readonly port: number
  readonly monitorPort: number
  readonly clusterPort: number
  readonly routePorts: ReadonlyArray<number>
  readonly storeDir: string
}): string =>
  [
    `server_name: ${options.name}`,
    `listen: 127.0.0.1:${options.port}`,
    `http: 127.0.0.1:${options.monitorPort}`,
    // As deploy/nats sets them: a client that stops answering is dropped after two pings 1 s apart.
    'ping_interval: "1s"',
    "ping_max: 2",
    "jetstream {",
    `  store_dir: "${options.storeDir}"`,
    "  max_memory_store: 64MB",
    "  max_file_store: 1GB",
    "}",
    "cluster {",
    "  name: quota-test",
    `  listen: 127.0.0.1:${options.clusterPort}`,
    `  routes: [${options.routePorts.map((port) => `"nats-route://127.0.0.1:${port}"`).join(", ")}]`,
    "}",
    ""
  ].join("\n")

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Starts the nodes and waits until JetStream answers on every one (a meta leader is elected). */
export const startNatsCluster = async (size = 3, readyTimeoutMs = 30_000): Promise<NatsCluster> => {
  const dir = await mkdtemp(join(tmpdir(), "quota-nats-cluster-"))
  const clusterPorts: Array<number> = []
  const monitorPorts: Array<number> = []
  for (let index = 0; index < size; index += 1) {
    clusterPorts.push(await freeLoopbackPort())
    monitorPorts.push(await freeLoopbackPort())
  }
  const nodes: Array<NatsClusterNode> = []
  const stop = async () => {
    await Promise.all(nodes.map((node) => node.server.stop()))
    await rm(dir, { recursive: true, force: true })
  }
  try {
    for (let index = 0; index < size; index += 1) {
      const name = `n${index + 1}`
      const server = await startNatsServer(join(dir, name), (port) =>
        clusterNodeConfig({
          name,
          port,
          monitorPort: monitorPorts[index]!,
          clusterPort: clusterPorts[index]!,
          routePorts: clusterPorts,
          storeDir: join(dir, name, "js")
        })
      )
      nodes.push({ name, server, monitorPort: monitorPorts[index]! })
    }
    const deadline = Date.now() + readyTimeoutMs
    for (const node of nodes) {
      for (;;) {
        const ready = await (async () => {
          const nc = await connect({ servers: node.server.url, reconnect: false })
          try {
            const info = await (await jetstreamManager(nc, { timeout: 2_000 })).getAccountInfo()
            return info !== undefined
          } catch {
            return false
          } finally {
            await nc.close()
          }
        })().catch(() => false)
        if (ready) break
        if (Date.now() > deadline)
          throw new Error(
            `JetStream not ready on ${node.name} after ${readyTimeoutMs} ms:\n` +
              nodes.map((each) => `--- ${each.name}\n${each.server.output()}`).join("\n")
          )
        await delay(250)
      }
    }
  } catch (error) {
    await stop()
    throw error
  }
  return { nodes, urls: nodes.map((node) => node.server.url).join(","), stop }
}

export interface ConnectionInfo {
  readonly cid: number
  readonly name?: string
  readonly subscriptions_list?: ReadonlyArray<string>
}

/** The client connections of a node, with their subscriptions (its /connz?subs=1). */
export const connectionsOf = async (node: NatsClusterNode): Promise<Array<ConnectionInfo>> => {
  const response = await fetch(`http://127.0.0.1:${node.monitorPort}/connz?subs=1&limit=1024`)
  const body = (await response.json()) as { connections?: Array<ConnectionInfo> }
  return body.connections ?? []
}
