// tsc compiles only TypeScript: the numbered .sql migrations are copied beside the compiled store.
import { cpSync } from "node:fs"

cpSync("src/store/migrations", "dist/src/store/migrations", { recursive: true })
