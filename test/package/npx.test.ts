import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { tempDirsPerTest } from "../service/harness.ts";

/**
 * `npx monkeytree` in a checkout links the checkout into npx's cache, which reruns its `prepare`
 * and `install` scripts there (see bin/lifecycle.js). A built checkout must start at once.
 */

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
  name: string;
  version: string;
  type: string;
  bin: Record<string, string>;
  scripts: Record<string, string>;
};
const fresh = tempDirsPerTest();

/**
 * A built checkout with this package.json's bin and lifecycle scripts, whose steps leave a
 * mark instead of compiling, and whose CLI only says it ran.
 */
function builtCheckout(): string {
  const dir = fresh();
  const checkout = join(dir, "checkout");
  cpSync(join(ROOT, "bin"), join(checkout, "bin"), { recursive: true });
  for (const output of ["dist/cli", "native/build/Release"]) mkdirSync(join(checkout, output), { recursive: true });
  writeFileSync(join(checkout, "dist/cli/monkeytree.js"), 'process.stdout.write("the built CLI ran\\n");\n');
  writeFileSync(join(checkout, "native/build/Release/monkeytree_native.node"), "");
  const { prepare, install } = pkg.scripts;
  const scripts = { prepare, install, build: "echo build >> steps.log" };
  writeFileSync(join(checkout, "package.json"), JSON.stringify({ name: pkg.name, version: pkg.version, type: pkg.type, bin: pkg.bin, scripts }));
  return checkout;
}

/** Runs the lifecycle wrapper as npm would for `command`, with a step that leaves a mark. */
function step(checkout: string, command: string, output: string) {
  return spawnSync(process.execPath, ["bin/lifecycle.js", output, "sh", "-c", "echo ran >> steps.log"], {
    cwd: checkout,
    encoding: "utf8",
    env: { ...process.env, npm_command: command },
  });
}

const steps = (checkout: string) => (existsSync(join(checkout, "steps.log")) ? readFileSync(join(checkout, "steps.log"), "utf8") : "");

describe("npx monkeytree in a checkout", () => {
  it("runs the built CLI without rebuilding the checkout", () => {
    const checkout = builtCheckout();
    // An npm cache of the test's own, so the checkout is linked into an npx cache that starts empty.
    const cache = join(checkout, "..", "npm-cache");
    const result = spawnSync("npx", ["monkeytree", "--help"], { cwd: checkout, encoding: "utf8", env: { ...process.env, npm_config_cache: cache } });
    expect(result.stderr).not.toMatch(/ERR/);
    expect(result.status).toBe(0);
    expect(result.stdout).toBe("the built CLI ran\n");
    // npm did link it into its npx cache, the only way npx has to a local package's bin.
    expect(existsSync(join(cache, "_npx"))).toBe(true);
    expect(steps(checkout)).toBe("");
  }, 60_000);

  it("builds under npx when the output is missing, and always under every other npm command", () => {
    const checkout = builtCheckout();
    expect(step(checkout, "exec", "dist/cli/monkeytree.js").status).toBe(0);
    expect(steps(checkout)).toBe("");
    expect(step(checkout, "exec", "dist/missing.js").status).toBe(0);
    for (const command of ["install", "ci", "rebuild", "pack"]) expect(step(checkout, command, "dist/cli/monkeytree.js").status).toBe(0);
    expect(steps(checkout)).toBe("ran\n".repeat(5));
  });

  it("fails as the step fails", () => {
    const checkout = builtCheckout();
    const failing = spawnSync(process.execPath, ["bin/lifecycle.js", "dist/missing.js", "sh", "-c", "exit 7"], { cwd: checkout, encoding: "utf8" });
    expect(failing.status).toBe(7);
  });
});
