import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { canRun, pythonTools, torch } from "../helpers/prerequisites.ts";
import { PYTHON } from "../helpers/python.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

// sdk/python as a Python project: ruff and mypy as its pyproject.toml configures them, and its
// pytest suite (the parts of the hook that need no other process). `npm run test:python` runs
// this file alone.
const ROOT = new URL("../../", import.meta.url).pathname;
const SDK = join(ROOT, "sdk/python");
const ready = canRun("test/python/project.test.ts", torch(), pythonTools());

/** Runs `python -m TOOL ARGS` in `cwd`, failing with the command and all it printed unless it exits 0. */
function passes(cwd: string, tool: string, ...args: string[]): string {
  const result = spawnSync(PYTHON, ["-m", tool, ...args], {
    cwd,
    encoding: "utf8",
    env: { ...process.env, OMP_NUM_THREADS: "1", PYTHONDONTWRITEBYTECODE: "1" },
  });
  const output = `${result.stdout}${result.stderr}${result.error?.message ?? ""}`;
  expect(result.status, `cd ${cwd} && ${PYTHON} -m ${tool} ${args.join(" ")} exited ${result.status}:\n${output}`).toBe(0);
  return output;
}

// mypy reads torch's annotations on its first run without a cache: tens of seconds on a loaded machine.
describe.skipIf(!ready)("the Python package sdk/python", { timeout: 3 * SAFETY_NET_MS }, () => {
  it("passes ruff, along with the Python of examples/, test/ and bench/ (ruff.toml extends sdk/python/pyproject.toml)", () => {
    passes(ROOT, "ruff", "check", "--output-format", "concise", "sdk/python", "examples", "test", "bench");
  });

  it("passes mypy --strict as configured, in the package and its tests", () => {
    expect(passes(SDK, "mypy")).toMatch(/^Success: no issues found/m);
  });

  it("passes its pytest suite", () => {
    expect(passes(SDK, "pytest", "-q", "-p", "no:cacheprovider")).toMatch(/\d+ passed/);
  });
});
