/**
 * The client-only package (issue 30 item 6): clients/ts built from src/client, packed with `npm pack`
 * and installed from the tarball into an empty project with `npm install --offline`, imports and
 * connects, and installs none of the server's dependencies.
 *
 * Offline, npm cannot resolve version ranges (that needs the registry's package documents); it installs
 * what a lockfile names from its cache by integrity. The empty project's lockfile takes the client's
 * dependencies at the versions and integrities of this repository's package-lock.json: the versions
 * the client is tested with, already in the cache of any machine that installed this repository.
 */
import { execFile } from "node:child_process"
import { createHash } from "node:crypto"
import { existsSync } from "node:fs"
import { copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { afterAll, describe, expect, it } from "vitest"

const run = promisify(execFile)
const repository = join(import.meta.dirname, "..", "..")
const packageDirectory = join(repository, "clients", "ts")
let temporary: string | undefined
afterAll(async () => {
  if (temporary !== undefined) await rm(temporary, { recursive: true, force: true })
})

type LockEntry = { readonly dependencies?: Record<string, string> } & Record<string, unknown>

/** A lockfile for a project depending on the tarball alone, its dependencies as this repository locks them. */
const lockfileFor = async (tarball: string, dependencies: Record<string, string>) => {
  const locked = (
    JSON.parse(await readFile(join(repository, "package-lock.json"), "utf8")) as {
      packages: Record<string, LockEntry>
    }
  ).packages
  const packages: Record<string, unknown> = {
    "": {
      name: "empty-project",
      version: "1.0.0",
      dependencies: { "@quota-coordinator/client": `file:${tarball}` }
    },
    "node_modules/@quota-coordinator/client": {
      version: "0.1.0",
      resolved: `file:${tarball}`,
      integrity: `sha512-${createHash("sha512")
        .update(await readFile(tarball))
        .digest("base64")}`,
      dependencies
    }
  }
  const todo = Object.keys(dependencies)
  for (let name = todo.pop(); name !== undefined; name = todo.pop()) {
    const key = `node_modules/${name}`
    if (key in packages) continue
    const entry = locked[key]
    if (entry === undefined) throw new Error(`${name} is not in package-lock.json`)
    const { dev: _dev, devOptional: _devOptional, peer: _peer, ...kept } = entry
    packages[key] = kept
    todo.push(...Object.keys(entry.dependencies ?? {}))
  }
  return { name: "empty-project", version: "1.0.0", lockfileVersion: 3, requires: true, packages }
}

describe("the client-only package", () => {
  it("packs, installs offline into an empty project, imports, and brings no server dependency", async () => {
    temporary = await mkdtemp(join(tmpdir(), "quota-client-package-"))
    const stage = join(temporary, "stage")
    const project = join(temporary, "project")
    await mkdir(stage)
    await mkdir(project)
    for (const file of ["package.json", "README.md"])
      await copyFile(join(packageDirectory, file), join(stage, file))
    const manifest = JSON.parse(await readFile(join(stage, "package.json"), "utf8")) as {
      version: string
      dependencies: Record<string, string>
    }
    const rootManifest = JSON.parse(await readFile(join(repository, "package.json"), "utf8")) as {
      version: string
    }
    expect(manifest.version).toBe(rootManifest.version)
    await run(
      "npx",
      ["tsc", "-p", join(packageDirectory, "tsconfig.json"), "--outDir", join(stage, "dist")],
      {
        cwd: repository
      }
    )
    const packed = await run("npm", ["pack", "--ignore-scripts", "--pack-destination", temporary], {
      cwd: stage
    })
    const tarball = join(temporary, packed.stdout.trim().split("\n").at(-1)!)

    const projectManifest = {
      name: "empty-project",
      version: "1.0.0",
      private: true,
      type: "module",
      dependencies: { "@quota-coordinator/client": `file:${tarball}` }
    }
    await writeFile(join(project, "package.json"), JSON.stringify(projectManifest))
    await writeFile(
      join(project, "package-lock.json"),
      JSON.stringify(await lockfileFor(tarball, manifest.dependencies))
    )
    await run("npm", ["install", "--offline", "--no-audit", "--no-fund"], { cwd: project })

    const script = [
      'import { LimitReached, QuotaClient, SlotWaitAborted, partitionOf } from "@quota-coordinator/client"',
      'const client = await QuotaClient.connect({ servers: "nats://127.0.0.1:4222", prefix: "pkgtest", partitions: 4 })',
      "console.log(JSON.stringify({ subject: client.subjectOf('alice'), partition: partitionOf('alice', 64),",
      "  errors: [typeof LimitReached, typeof SlotWaitAborted] }))",
      "await client.close()"
    ].join("\n")
    await writeFile(join(project, "check.mjs"), script)
    const checked = await run("node", ["check.mjs"], { cwd: project })
    expect(JSON.parse(checked.stdout)).toEqual({
      subject: "pkgtest.v1.3.ops",
      partition: 39,
      errors: ["function", "function"]
    })
    const installed = (name: string) => existsSync(join(project, "node_modules", name))
    expect({
      client: installed("@quota-coordinator/client"),
      pg: installed("pg"),
      pglite: installed("@electric-sql/pglite"),
      promClient: installed("prom-client"),
      pino: installed("pino")
    }).toEqual({ client: true, pg: false, pglite: false, promClient: false, pino: false })
  }, 120_000)
})
