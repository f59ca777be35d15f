import { execFileSync, spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * The package as a user gets it: `npm pack`, installed into an empty project (dependencies from
 * npm's cache; the addon compiles there), then used with plain Node, from TypeScript against
 * the shipped declarations, and through `npx monkeytree`.
 */

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const TSC = join(ROOT, "node_modules/typescript/bin/tsc");

/** The README's library snippet, a whole program, as printed there. */
function readmeSnippet(): string {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("### As a library"));
  const snippet = /```js\n([\s\S]*?)```/.exec(section)?.[1];
  if (!snippet) throw new Error('README.md\'s "As a library" section has no ```js block');
  return snippet;
}

function run(command: string, args: readonly string[], cwd: string) {
  const result = spawnSync(command, args, { cwd, encoding: "utf8" });
  return { status: result.status, stdout: result.stdout, stderr: result.stderr };
}

describe("the npm package", () => {
  let dir: string;
  let consumer: string;
  let packed: string[];

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "monkeytree-pack-"));
    // --ignore-scripts packs the dist/ that `npm test` built first: running prepare here would
    // rebuild dist/ under the tests that are running it at the same time.
    const [pack] = JSON.parse(execFileSync("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", dir], { cwd: ROOT, encoding: "utf8" })) as {
      filename: string;
      files: { path: string }[];
    }[];
    packed = pack!.files.map((f) => f.path);
    consumer = join(dir, "consumer");
    mkdirSync(consumer);
    // allowScripts lets the addon compile under an npm that holds back dependencies' install scripts.
    writeFileSync(join(consumer, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module", allowScripts: { monkeytree: true } }));
    execFileSync("npm", ["install", join(dir, pack!.filename), "--prefer-offline", "--no-audit", "--no-fund"], { cwd: consumer, stdio: "pipe" });
  }, 600_000);

  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("holds compiled modules with declarations, the addon's sources and the CLI's data, not sources or builds", () => {
    for (const file of [
      "dist/sdk/index.js",
      "dist/sdk/index.d.ts",
      "dist/controller/planner/index.js",
      "dist/cli/monkeytree.js",
      "bin/monkeytree.js",
      "native/binding.gyp",
      "native/src/addon.cpp",
      "cli/snapshots/dp-1024gpu-lambda2.json",
    ]) {
      expect(packed).toContain(file);
    }
    expect(packed.filter((f) => f.startsWith("native/build/") || f.startsWith("test/") || (f.endsWith(".ts") && !f.endsWith(".d.ts")))).toEqual([]);
  });

  it("runs the README's snippet with plain node, and loads the launchers' entry point", () => {
    writeFileSync(join(consumer, "plan.mjs"), readmeSnippet());
    const planned = run(process.execPath, ["plan.mjs", "node_modules/monkeytree/cli/snapshots/dp-1024gpu-lambda2.json"], consumer);
    expect(planned.stderr).toBe("");
    expect(planned.status).toBe(0);
    expect(planned.stdout).toMatch(/^optimal: 2 moves$/m);
    expect(planned.stdout).toMatch(/^after the plan: \d+ DP flows, at most 1 per link$/m);
    const entry = run(
      process.execPath,
      ["--input-type=module", "-e", 'import { WorkerClient } from "monkeytree"; process.stdout.write(typeof WorkerClient);'],
      consumer,
    );
    expect(entry.stderr).toBe("");
    expect(entry.stdout).toBe("function");
  });

  it("starts the controller's planner thread from the installed dist/ with plain node", () => {
    const dist = join(consumer, "node_modules/monkeytree/dist");
    const program = [
      `import { PlanThread } from ${JSON.stringify(join(dist, "controller/service/plan-thread.js"))};`,
      `import { parseSnapshot } from "monkeytree/planner";`,
      'const cluster = parseSnapshot({ topology: { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 1 }, jobs: [{ id: "a", hosts: [0, 4] }, { id: "b", hosts: [1, 5] }] });',
      "const planner = new PlanThread();",
      "const plan = await planner.plan(cluster, 2000);",
      "await planner.close();",
      "process.stdout.write(JSON.stringify({ status: plan.status, moves: plan.moveCount }));",
    ].join("\n");
    writeFileSync(join(consumer, "thread.js"), program);
    const { status, stdout, stderr } = run(process.execPath, ["thread.js"], consumer);
    expect(stderr).toBe("");
    expect(status).toBe(0);
    expect(JSON.parse(stdout)).toEqual({ status: "optimal", moves: 1 });
  });

  it("type-checks a consumer's TypeScript against the shipped declarations", () => {
    writeFileSync(
      join(consumer, "consumer.ts"),
      `import fs from "node:fs";
import { createPlanner, InvalidInputError, parseSnapshot, routeCluster, type Plan, type Routes } from "monkeytree/planner";
import { ControllerClient, ControllerError, replacementFromEnv, TransferError, WorkerClient, type ReplacementEnv } from "monkeytree";
import { DirectiveSchema, type Directive } from "monkeytree/protocol";
import { readCheckpoint, type CheckpointView } from "monkeytree/checkpoint";
import { crc32c } from "monkeytree/native";

const cluster = parseSnapshot(JSON.parse(fs.readFileSync(process.argv[2]!, "utf8")));
const plan: Plan = (await createPlanner()).plan(cluster, { timeLimitMs: 2000 });
const routes: Routes = routeCluster(cluster);
// @ts-expect-error a plan's move count is a number, so the declarations are typed, not any
const wrong: string = plan.moveCount;
const client = new ControllerClient({ endpoint: "tcp://127.0.0.1:5555" });
const worker = new WorkerClient(client, { job: "j", group: 0, host: 0 }, { tp: 1, pp: 1, dp: 1 });
const directive: Directive = DirectiveSchema.parse({ kind: "continue" });
const replacement: ReplacementEnv | null = replacementFromEnv();
const view: CheckpointView = readCheckpoint(new Uint8Array(64));
const checksum: number = crc32c(new Uint8Array(8));
const errors = [InvalidInputError, ControllerError, TransferError];
export { routes, wrong, worker, directive, replacement, view, checksum, errors };
`,
    );
    writeFileSync(
      join(consumer, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          module: "NodeNext",
          moduleResolution: "NodeNext",
          target: "ES2022",
          strict: true,
          noEmit: true,
          // Checks the shipped .d.ts files themselves, not only what the consumer uses.
          skipLibCheck: false,
          typeRoots: [join(ROOT, "node_modules/@types")],
          types: ["node"],
        },
        files: ["consumer.ts"],
      }),
    );
    const { status, stdout } = run(process.execPath, [TSC, "-p", "."], consumer);
    expect(stdout).toBe("");
    expect(status).toBe(0);
  }, 180_000);

  it("runs `npx monkeytree plan`, on the embedded example and on a snapshot file", () => {
    const embedded = run("npx", ["--no", "monkeytree", "plan"], consumer);
    expect(embedded.status).toBe(0);
    expect(embedded.stdout).toMatch(/^optimal: 2 moves in 1 step, proved minimal/m);
    copyFileSync(join(ROOT, "examples/snapshots/tp8-pp-1024gpu.json"), join(consumer, "cluster.json"));
    const file = run("npx", ["--no", "monkeytree", "plan", "--snapshot", "cluster.json"], consumer);
    expect(file.status).toBe(0);
    expect(file.stdout).toMatch(/^optimal: 4 moves in \d+ steps?, proved minimal/m);
  });
});
