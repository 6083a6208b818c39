/**
 * A TCP proxy in front of Postgres that can stop one connection in the middle of a write transaction:
 * armed, it forwards a connection's messages up to and including the Sync that follows the fence
 * statement (the epoch check, which locks the owner rows FOR KEY SHARE), then holds back everything
 * else that connection sends until `release`. Postgres then has an open transaction holding the rows,
 * exactly as when the process froze (or its network went away) between sending the fence and the
 * COMMIT; a pipelined write is sent in one go, so a SIGSTOP alone almost never lands there.
 *
 * It reads the frontend protocol only as far as framing: a startup packet without a type byte, then
 * messages of one type byte and a 4-byte length that counts itself.
 */
import net from "node:net"

export interface HoldingProxy {
  readonly port: number
  /** Resolves when a connection sent its fence statement and Sync and is now held. */
  readonly holdNextFencedWrite: () => Promise<void>
  /** Forwards what the held connection sent meanwhile, and everything after. */
  readonly release: () => void
  /** Local ports of the proxy's connections to Postgres (pg_stat_activity's client_port). */
  readonly upstreamPorts: () => Array<number>
  readonly close: () => Promise<void>
}

/**
 * The fence statement, before and after it became a function (writeEvents.ts, migration 0003), and the
 * name it is prepared under (a connection sends its text once, then Binds the name).
 */
const fencePattern = /assert_partition_epochs|for share of owner_row|quota_assertFence_/

interface Connection {
  /** Bytes received from the client and not yet framed. */
  pending: Buffer
  startupDone: boolean
  /** Saw the fence's Parse, Bind or simple Query; hold after the next Sync. */
  fenceSeen: boolean
  held: boolean
  heldBytes: Array<Buffer>
  readonly upstream: net.Socket
}

export const startHoldingProxy = async (targetHost: string, targetPort: number): Promise<HoldingProxy> => {
  const sockets = new Set<net.Socket>()
  const upstreams = new Set<net.Socket>()
  let armed: (() => void) | undefined
  let heldConnection: Connection | undefined

  /** Frames what arrived; forwards whole messages until the connection is held. */
  const onClientData = (connection: Connection, chunk: Buffer) => {
    if (connection.held) {
      connection.heldBytes.push(chunk)
      return
    }
    connection.pending = Buffer.concat([connection.pending, chunk])
    for (;;) {
      const { pending } = connection
      if (!connection.startupDone) {
        if (pending.length < 4) return
        const length = pending.readInt32BE(0)
        if (pending.length < length) return
        connection.upstream.write(pending.subarray(0, length))
        connection.pending = pending.subarray(length)
        // An SSLRequest (80877103) is answered 'N' by the server and followed by the real startup.
        if (length !== 8 || pending.readInt32BE(4) !== 80877103) connection.startupDone = true
        continue
      }
      if (pending.length < 5) return
      const length = pending.readInt32BE(1) + 1
      if (pending.length < length) return
      const message = pending.subarray(0, length)
      connection.pending = pending.subarray(length)
      connection.upstream.write(message)
      const type = String.fromCharCode(message[0]!)
      if (
        armed !== undefined &&
        (type === "P" || type === "Q" || type === "B") &&
        fencePattern.test(message.toString("utf8"))
      ) {
        connection.fenceSeen = true
      }
      if (type !== "S" && type !== "Q") continue
      // The end of a statement: hold here if it was the fence and a hold is wanted.
      if (!connection.fenceSeen || armed === undefined) {
        connection.fenceSeen = false
        continue
      }
      connection.held = true
      connection.heldBytes.push(connection.pending)
      connection.pending = Buffer.alloc(0)
      heldConnection = connection
      const resolve = armed
      armed = undefined
      resolve()
      return
    }
  }

  const server = net.createServer((client) => {
    const upstream = net.connect(targetPort, targetHost)
    const connection: Connection = {
      pending: Buffer.alloc(0),
      startupDone: false,
      fenceSeen: false,
      held: false,
      heldBytes: [],
      upstream
    }
    sockets.add(client).add(upstream)
    upstreams.add(upstream)
    const drop = () => {
      client.destroy()
      upstream.destroy()
      sockets.delete(client)
      sockets.delete(upstream)
      upstreams.delete(upstream)
    }
    client.on("error", drop).on("close", drop)
    upstream.on("error", drop).on("close", drop)
    client.on("data", (chunk: Buffer) => onClientData(connection, chunk))
    upstream.pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as net.AddressInfo).port

  return {
    port,
    holdNextFencedWrite: () =>
      new Promise<void>((resolve) => {
        armed = resolve
      }),
    release: () => {
      const connection = heldConnection
      heldConnection = undefined
      if (connection === undefined) return
      connection.held = false
      connection.fenceSeen = false
      const bytes = Buffer.concat(connection.heldBytes)
      connection.heldBytes = []
      if (bytes.length > 0) onClientData(connection, bytes)
    },
    upstreamPorts: () =>
      [...upstreams].flatMap((socket) => (socket.localPort === undefined ? [] : [socket.localPort])),
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy()
        sockets.clear()
        server.close(() => resolve())
      })
  }
}
