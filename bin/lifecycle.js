#!/usr/bin/env node
// Runs one of npm's build lifecycle scripts: `node bin/lifecycle.js OUTPUT COMMAND [ARGS...]`.
//
// `npx monkeytree` in a checkout never uses node_modules/.bin: because the checkout's own
// package.json declares the `monkeytree` bin, npm exec links the checkout into its npx cache to
// get at that bin, and linking reruns the checkout's `prepare` and `install` scripts in the
// checkout itself: close to a minute of tsc and node-gyp for a checkout that `npm install` has
// already built. So under npm exec a step whose OUTPUT exists is skipped; everywhere else (npm
// install, ci, rebuild, pack, a consumer installing the package) the step always runs.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";

const [output, command, ...args] = process.argv.slice(2);
if (!output || !command) {
  process.stderr.write("usage: lifecycle.js OUTPUT COMMAND [ARGS...]\n");
  process.exit(2);
}
if (process.env.npm_command === "exec" && existsSync(output)) process.exit(0);

const result = spawnSync(command, args, { stdio: "inherit" });
if (result.error) {
  process.stderr.write(`lifecycle.js: ${command}: ${result.error.message}\n`);
  process.exit(1);
}
process.exit(result.status ?? 1);
