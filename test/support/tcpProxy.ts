/**
 * A TCP proxy to a service of this machine (Postgres, NATS) that a test can break and mend, as the
 * proxied clients see it, without touching the shared server:
 *
 * - reset mode (`cut`): every connection reset, new ones refused (the server died, the port closed);
 * - silent mode (`silence`): nothing forwarded either way and nothing closed (a network partition):
 *   bytes wait in the proxy, connections made meanwhile are accepted and get no byte (not even the
 *   server's greeting) until `resume`, which forwards again what is still open, or `cut`. It may spare
 *   some connections (by their port towards the server: Postgres's `client_port`) and let new ones pass;
 * - silent and losing (`silence("lost")`): the same, but what is sent meanwhile is lost, as a network
 *   that drops packets (a proxy that passes nothing): a connection made meanwhile loses the server's
 *   greeting, and a close by the server meanwhile never reaches the client, so a client waits for what
 *   it lost until it gives the attempt up, even once `resume`d.
 */
import net from "node:net"

export interface TcpProxy {
  readonly port: number
  /** Drops every connection and refuses new ones. */
  readonly cut: () => Promise<void>
  /** Accepts connections again on the same port. */
  readonly restore: () => Promise<void>
  /**
   * Stops forwarding bytes both ways, closing nothing (a connection made meanwhile waits, silent). What
   * is sent meanwhile waits in the proxy ("held", the default) or is lost ("lost").
   */
  readonly silence: (options?: SilenceOptions) => void
  /**
   * Forwards again on every connection still open (what waited in the proxy goes through first); a
   * connection already forwarding is left as it is, so resuming a proxy that was not silent is a no-op.
   */
  readonly resume: () => void
  /** Forwards again on the silent connections whose local port towards the server is one of these. */
  readonly resumePorts: (ports: ReadonlySet<number>) => void
  /**
   * Points the proxy at another port of the same host (a failover behind a stable address): every
   * connection through it is dropped, and new ones reach the new target.
   */
  readonly retarget: (targetPort: number) => void
  readonly close: () => Promise<void>
}

export interface SilenceOptions {
  /** What is sent meanwhile: waits in the proxy ("held", the default) or is lost ("lost"). */
  readonly bytes?: "held" | "lost"
  /** Connections whose local port towards the server is one of these keep forwarding. */
  readonly sparedUpstreamPorts?: ReadonlySet<number>
  /** Connections made during the silence: silent (default, a partition) or forwarded (a stuck flow). */
  readonly newConnections?: "silent" | "pass"
}

interface Pair {
  readonly client: net.Socket
  upstream: net.Socket | undefined
  /** Piped both ways now: forwarding it again would pipe it twice (every byte sent twice). */
  flowing: boolean
  /** The server closed its side while bytes were lost: the client's side stays open, and silent. */
  severed: boolean
}

/** Reads and drops what arrives on a socket while the proxy loses bytes. */
const discard = (_chunk: Buffer): void => {}

export const startTcpProxy = async (targetHost: string, firstTargetPort: number): Promise<TcpProxy> => {
  let targetPort = firstTargetPort
  const pairs = new Set<Pair>()
  let silent: false | "held" | "lost" = false
  const drop = (pair: Pair) => {
    pair.client.destroy()
    pair.upstream?.destroy()
    pairs.delete(pair)
  }
  /** Connects the pair's upstream (once). */
  const connectUpstream = (pair: Pair): net.Socket => {
    if (pair.upstream === undefined) {
      const upstream = net.connect(targetPort, targetHost)
      pair.upstream = upstream
      const closed = () => {
        if (silent === "lost") pair.severed = true
        else drop(pair)
      }
      upstream.on("error", closed).on("close", closed)
    }
    return pair.upstream
  }
  /** Connects the pair's upstream (once) and forwards both ways. */
  const forward = (pair: Pair) => {
    if (pair.severed || pair.flowing) return
    pair.flowing = true
    const upstream = connectUpstream(pair)
    pair.client.off("data", discard)
    upstream.off("data", discard)
    pair.client.pipe(upstream)
    upstream.pipe(pair.client)
    pair.client.resume()
    upstream.resume()
  }
  const hold = (pair: Pair) => {
    pair.flowing = false
    if (pair.upstream !== undefined) {
      pair.client.unpipe(pair.upstream)
      pair.upstream.unpipe(pair.client)
      pair.upstream.pause()
    }
    pair.client.pause()
  }
  /** Reads and drops both ways; the upstream is connected, so the server's greeting is lost too. */
  const lose = (pair: Pair) => {
    hold(pair)
    const upstream = connectUpstream(pair)
    for (const socket of [pair.client, upstream]) socket.on("data", discard).resume()
  }
  const makeServer = () =>
    net.createServer((client) => {
      const pair: Pair = { client, upstream: undefined, flowing: false, severed: false }
      pairs.add(pair)
      client.on("error", () => drop(pair)).on("close", () => drop(pair))
      if (silent === "held") client.pause()
      else if (silent === "lost") lose(pair)
      else forward(pair)
    })
  let server = makeServer()
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as net.AddressInfo).port
  const closeServer = () =>
    new Promise<void>((resolve) => {
      silent = false
      for (const pair of [...pairs]) drop(pair)
      server.close(() => resolve())
    })
  return {
    port,
    cut: closeServer,
    restore: async () => {
      server = makeServer()
      await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve))
    },
    silence: (options = {}) => {
      const bytes = options.bytes ?? "held"
      silent = options.newConnections === "pass" ? false : bytes
      for (const pair of pairs) {
        const spared = pair.upstream?.localPort
        if (spared !== undefined && options.sparedUpstreamPorts?.has(spared) === true) continue
        ;(bytes === "held" ? hold : lose)(pair)
      }
    },
    resume: () => {
      silent = false
      for (const pair of pairs) forward(pair)
    },
    resumePorts: (ports) => {
      for (const pair of pairs) {
        const port = pair.upstream?.localPort
        if (port !== undefined && ports.has(port)) forward(pair)
      }
    },
    retarget: (port) => {
      targetPort = port
      for (const pair of [...pairs]) drop(pair)
    },
    close: closeServer
  }
}
