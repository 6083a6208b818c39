/**
 * A TCP proxy to this machine's Postgres that a test can cut and restore: an outage of the database
 * as its clients see it (connections reset, new ones refused), without stopping the shared server.
 */
import net from "node:net"

export interface TcpProxy {
  readonly port: number
  /** Drops every connection and refuses new ones. */
  readonly cut: () => Promise<void>
  /** Accepts connections again on the same port. */
  readonly restore: () => Promise<void>
  readonly close: () => Promise<void>
}

export const startTcpProxy = async (targetHost: string, targetPort: number): Promise<TcpProxy> => {
  const sockets = new Set<net.Socket>()
  const makeServer = () =>
    net.createServer((client) => {
      const upstream = net.connect(targetPort, targetHost)
      sockets.add(client).add(upstream)
      const drop = () => {
        client.destroy()
        upstream.destroy()
        sockets.delete(client)
        sockets.delete(upstream)
      }
      client.on("error", drop).on("close", drop)
      upstream.on("error", drop).on("close", drop)
      client.pipe(upstream).pipe(client)
    })
  let server = makeServer()
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as net.AddressInfo).port
  const closeServer = () =>
    new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy()
      sockets.clear()
      server.close(() => resolve())
    })
  return {
    port,
    cut: closeServer,
    restore: async () => {
      server = makeServer()
      await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve))
    },
    close: closeServer
  }
}
