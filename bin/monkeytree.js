#!/usr/bin/env node
// The CLI runs compiled: `npm run build` (run by `npm install` in a checkout, and before
// packing) writes dist/, so plain Node starts it without a TypeScript loader.
import { existsSync } from "node:fs";

const entry = new URL("../dist/cli/monkeytree.js", import.meta.url);
if (!existsSync(entry)) {
  process.stderr.write("monkeytree: dist/ is not built; run `npm run build` in the checkout\n");
  process.exit(2);
}
await import(entry.href);
