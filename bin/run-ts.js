#!/usr/bin/env node
// Runs a TypeScript entry point (benchmarks, examples) with the same loader as the CLI.
import { register } from "tsx/esm/api";
import { pathToFileURL } from "node:url";
import { resolve } from "node:path";

const [entry, ...rest] = process.argv.slice(2);
if (!entry) {
  process.stderr.write("usage: run-ts.js FILE.ts [ARGS...]\n");
  process.exit(2);
}
process.argv = [process.argv[0], resolve(entry), ...rest];
register();
await import(pathToFileURL(resolve(entry)).href);
