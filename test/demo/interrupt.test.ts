import { execFileSync, spawn } from "node:child_process";
import { readdirSync, rmSync } from "node:fs";
import { createInterface } from "node:readline";
import { describe, expect, it } from "vitest";
import { RUN_TS } from "../../sdk/contract/paths.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/** Process ids whose parent is `pid`: the demo starts each of its processes as its own group's leader. */
function childrenOf(pid: number): number[] {
  try {
    return execFileSync("ps", ["-o", "pid=", "--ppid", String(pid)], { encoding: "utf8" })
      .split("\n")
      .filter(Boolean)
      .map(Number);
  } catch {
    return []; // ps exits 1 when there is none
  }
}

/** Processes still in the group led by `pgid`. */
function groupMembers(pgid: number): string[] {
  try {
    return execFileSync("ps", ["-o", "pid=,args=", "-g", String(pgid)], { encoding: "utf8" })
      .split("\n")
      .filter(Boolean);
  } catch {
    return []; // ps exits 1 when the group is empty
  }
}

const stagingOf = (pids: readonly number[]) => readdirSync("/dev/shm").filter((name) => pids.some((pid) => name.startsWith(`monkeytree-${pid}-`)));

describe("monkeytree demo, interrupted", () => {
  it(
    "stops every process it started and frees their shared memory on SIGINT, says so and exits 130",
    async () => {
      const demo = spawn(
        process.execPath,
        [RUN_TS, "cli/monkeytree.ts", "demo", "--state-mb", "1", "--steps", "100000", "--step-ms", "50", "--timeout", String(SAFETY_NET_MS / 1000)],
        {
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      const exited = new Promise<number | null>((resolve) => demo.once("exit", (code) => resolve(code)));
      let stderr = "";
      let groups: number[] = [];
      let dir: string | undefined;
      demo.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
      // Every process the demo starts, gathered as it starts them: a moved worker's source may
      // have exited by the time the plan is printed.
      const seen = () => {
        if (demo.exitCode === null) groups = [...new Set([...groups, ...childrenOf(demo.pid!)])];
        return groups.length;
      };
      const gathering = setInterval(seen, 100);
      try {
        const lines = createInterface({ input: demo.stdout! });
        const printed = (pattern: RegExp) =>
          new Promise<void>((resolve, reject) => {
            lines.on("line", (line) => {
              dir ??= /^working directory (\S+)$/.exec(line)?.[1];
              if (pattern.test(line)) resolve();
            });
            void exited.then((code) => reject(new Error(`the demo exited (${code}) before printing ${pattern}: ${stderr}`)));
          });
        await printed(/^\s*[\d.]+ s\s+plan: /);
        // A controller, 8 daemons and 8 workers at least (a worker may have a launcher child of its own).
        expect(seen()).toBeGreaterThanOrEqual(17);
        // Planned: the destinations' daemons start the replacements (no --job: they take their
        // identity from the environment) while the jobs run on to their stop step.
        const replacements = () =>
          execFileSync("ps", ["-e", "-o", "args="], { encoding: "utf8" })
            .split("\n")
            .filter((args) => args.includes(dir!) && args.includes("worker.ts") && !args.includes("--job"));
        await expect.poll(() => replacements().length, patiently).toBeGreaterThan(0);
        clearInterval(gathering);
        seen();
        // A replacement starts once its daemon staged a file for the move's checkpoint.
        expect(stagingOf(groups).length).toBeGreaterThanOrEqual(1);

        demo.kill("SIGINT");
        expect(await exited).toBe(130);
        expect(stderr).toMatch(/^monkeytree demo: SIGINT: stopped every process it started and removed \d+ staging buffers from \/dev\/shm\n$/);
        expect(groups.flatMap(groupMembers)).toEqual([]);
        // The replacements its daemons started, in groups of their own, are gone too (their
        // command lines name the demo's working directory).
        expect(replacements()).toEqual([]);
        expect(stagingOf(groups)).toEqual([]);
      } finally {
        clearInterval(gathering);
        demo.kill("SIGKILL");
        // Whatever a failed run left: the demo's groups, and any process naming its directory.
        const leftovers =
          dir === undefined
            ? []
            : execFileSync("ps", ["-e", "-o", "pid=,args="], { encoding: "utf8" })
                .split("\n")
                .filter((line) => line.includes(dir!));
        for (const target of [...groups.map((pgid) => -pgid), ...leftovers.map((line) => Number.parseInt(line, 10))]) {
          try {
            process.kill(target, "SIGKILL");
          } catch {
            // Already gone, as it should be.
          }
        }
        // An interrupted demo keeps its working directory for the user to read; the test has no use for it.
        if (dir !== undefined) rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
      }
    },
    3 * SAFETY_NET_MS,
  );
});
