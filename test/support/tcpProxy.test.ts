/**
 * The test proxy itself: resuming a proxy that was not silent must not pipe its connections a second
 * time. The nemesis heals every proxy with `resume()` at the end of a run; before this was guarded,
 * every byte of every open connection then went through twice (Postgres answered each statement
 * twice: `commit answered BEGIN` in all three processes of seed 302 within 100 ms of the heal).
 */
import net from "node:net"
import { once } from "node:events"
import { afterEach, describe, expect, it } from "vitest"
import type { TcpProxy } from "./tcpProxy.js"
import { startTcpProxy } from "./tcpProxy.js"

const closers: Array<() => Promise<void>> = []
// Last opened, first closed: the server closes once no connection to it is left.
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close()
})

/** A server that counts what it receives and answers each chunk with "ok". */
const countingServer = async () => {
  const received: Array<string> = []
  /** The proxy's port towards the server of each connection, in the order they arrived. */
  const ports: Array<number> = []
  const server = net.createServer((socket) => {
    ports.push(socket.remotePort!)
    socket.on("data", (chunk) => {
      received.push(chunk.toString())
      socket.write("ok")
    })
  })
  server.listen(0, "127.0.0.1")
  await once(server, "listening")
  closers.push(() => new Promise((resolve) => server.close(() => resolve())))
  return { port: (server.address() as net.AddressInfo).port, received, ports }
}

const connectThrough = async (proxy: TcpProxy) => {
  const socket = net.connect(proxy.port, "127.0.0.1")
  await once(socket, "connect")
  let answers = ""
  socket.on("data", (chunk) => (answers += chunk.toString()))
  closers.push(async () => {
    socket.destroy()
  })
  return { socket, answers: () => answers }
}

const settle = () => new Promise((resolve) => setTimeout(resolve, 100))

/** A counting server, a proxy to it and a client through the proxy that sent "a", all settled. */
const proxiedAfterOneByte = async () => {
  const server = await countingServer()
  const proxy = await startTcpProxy("127.0.0.1", server.port)
  closers.push(proxy.close)
  const client = await connectThrough(proxy)
  client.socket.write("a")
  await settle()
  return { server, proxy, client }
}

describe("tcpProxy", () => {
  it("resume() on a proxy that was not silent forwards each byte once", async () => {
    const { server, proxy, client } = await proxiedAfterOneByte()
    proxy.resume()
    proxy.resume()
    client.socket.write("b")
    await settle()
    expect(server.received.join("")).toBe("ab")
    expect(client.answers()).toBe("okok")
  })

  it("silence() then resume() forwards what waited, once", async () => {
    const { server, proxy, client } = await proxiedAfterOneByte()
    proxy.silence()
    client.socket.write("b")
    await settle()
    expect(server.received.join("")).toBe("a")
    proxy.resume()
    await settle()
    expect(server.received.join("")).toBe("ab")
    expect(client.answers()).toBe("okok")
  })
  it("resumePorts() forwards again only the silent connections on those ports", async () => {
    const { server, proxy, client } = await proxiedAfterOneByte()
    const other = await connectThrough(proxy)
    other.socket.write("x")
    await settle()
    proxy.silence()
    client.socket.write("b")
    other.socket.write("y")
    await settle()
    proxy.resumePorts(new Set([server.ports[0]!]))
    await settle()
    expect(server.received.join("")).toBe("axb")
    expect(other.answers()).toBe("ok")
    proxy.resume()
    await settle()
    expect(server.received.join("")).toBe("axby")
  })
})
