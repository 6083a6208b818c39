/**
 * A TCP proxy to a service of this machine (Postgres, NATS) that a test can break and mend, as the
 * proxied clients see it, without touching the shared server:
 *
 * - reset mode (`cut`): every connection reset, new ones refused (the server died, the port closed);
 * - silent mode (`silence`): nothing forwarded either way and nothing closed (a network partition):
 *   bytes wait in the proxy, connections made meanwhile are accepted and get no byte (not even the
 *   server's greeting) until `resume`, which forwards again what is still open, or `cut`. It may spare
 *   some connections (by their port towards the server: Postgres's `client_port`) and let new ones pass.
 */
import net from "node:net"

export interface TcpProxy {
  readonly port: number
  /** Drops every connection and refuses new ones. */
  readonly cut: () => Promise<void>
  /** Accepts connections again on the same port. */
  readonly restore: () => Promise<void>
  /** Stops forwarding bytes both ways, closing nothing (a connection made meanwhile waits, silent). */
  readonly silence: (options?: SilenceOptions) => void
  /**
   * Forwards again on every connection still open (what waited in the proxy goes through first); a
   * connection already forwarding is left as it is, so resuming a proxy that was not silent is a no-op.
   */
  readonly resume: () => void
  /** Forwards again on the silent connections whose local port towards the server is one of these. */
  readonly resumePorts: (ports: ReadonlySet<number>) => void
  readonly close: () => Promise<void>
}

export interface SilenceOptions {
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
}

export const startTcpProxy = async (targetHost: string, targetPort: number): Promise<TcpProxy> => {
  const pairs = new Set<Pair>()
  let silent = false
  const drop = (pair: Pair) => {
    pair.client.destroy()
    pair.upstream?.destroy()
    pairs.delete(pair)
  }
  /** Connects the pair's upstream (once) and forwards both ways. */
  const forward = (pair: Pair) => {
    if (pair.flowing) return
    pair.flowing = true
    if (pair.upstream === undefined) {
      const upstream = net.connect(targetPort, targetHost)
      pair.upstream = upstream
      upstream.on("error", () => drop(pair)).on("close", () => drop(pair))
    }
    pair.client.pipe(pair.upstream)
    pair.upstream.pipe(pair.client)
    pair.client.resume()
    pair.upstream.resume()
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
  const makeServer = () =>
    net.createServer((client) => {
      const pair: Pair = { client, upstream: undefined, flowing: false }
      pairs.add(pair)
      client.on("error", () => drop(pair)).on("close", () => drop(pair))
      if (silent) client.pause()
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
    silence: (options) => {
      silent = options?.newConnections !== "pass"
      for (const pair of pairs) {
        const port = pair.upstream?.localPort
        if (port === undefined || options?.sparedUpstreamPorts?.has(port) !== true) hold(pair)
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
    close: closeServer
  }
}
