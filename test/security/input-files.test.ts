import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { MAX_TRACE_JOBS, MAX_TRACE_SECONDS } from "../../controller/simulator/jobs.ts";
import { MAX_HOSTS, MAX_HOSTS_PER_RACK, MAX_TOPOLOGY_BYTES } from "../../sdk/contract/protocol/limits.ts";

/**
 * Input files that once cost minutes and gigabytes, or ended in an internal error: a hostlist
 * of astronomical ranges, a topology of millions of tiny YAML nodes, a topology.conf whose
 * switches loop, a trace or sacct dump past what a run replays, a number past any time. Each
 * is refused in one line with exit 2, by the CLI run from source in a child with a small heap,
 * so an unbounded loop fails the test (killed, or out of memory) instead of the test runner.
 */

const dir = mkdtempSync(join(tmpdir(), "monkeytree-input-files-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let written = 0;
function write(name: string, text: string): string {
  const path = join(dir, `${written++}-${name}`);
  writeFileSync(path, text);
  return path;
}

/** Far past what a refusal takes on a loaded 2-core machine, far below what the attacks took (a minute or more). */
const CHILD_MS = 40_000;

interface Run {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stderr: string;
}

/** `monkeytree ARGS` from source with a 256 MB heap, killed after `CHILD_MS`. */
function monkeytree(...args: string[]): Promise<Run> {
  const child = spawn(process.execPath, ["--max-old-space-size=256", "--import", "tsx", "cli/monkeytree.ts", ...args], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const timer = setTimeout(() => child.kill("SIGKILL"), CHILD_MS);
  return new Promise((resolve) =>
    child.once("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stderr });
    }),
  );
}

/** Exit 2 with `message` as the one line on stderr. */
function expectRefused(run: Run, command: string, message: string): void {
  expect(run.signal, run.stderr).toBeNull();
  expect(run.stderr).toBe(`monkeytree ${command}: ${message}\n`);
  expect(run.code).toBe(2);
}

/** `monkeytree slurm`, which reads the topology before it asks Slurm anything; a topology.conf needs the uplink count. */
const slurm = (topology: string) => monkeytree("slurm", "--topology", topology, ...(topology.endsWith(".conf") ? ["--uplinks-per-rack", "1"] : []));

describe("a hostlist past the supported size", () => {
  it(
    "a range bound past 2^53, or not decimal, is refused without expanding it",
    async () => {
      const huge = "1".padEnd(24, "0");
      const conf = write("huge.conf", `SwitchName=s0 Nodes=n[${huge}-${huge}]\n`);
      expectRefused(
        await slurm(conf),
        "slurm",
        `topology ${conf} at line 1: hostlist "n[${huge}-${huge}]": range ${huge}-${huge} has a bound over ${Number.MAX_SAFE_INTEGER}; host numbers are decimal and at most that`,
      );
      const exponent = write("exponent.conf", "SwitchName=s0 Nodes=n[1e23-1e23]\n");
      expectRefused(
        await slurm(exponent),
        "slurm",
        `topology ${exponent} at line 1: hostlist "n[1e23-1e23]": "[1e23-1e23]" must hold numbers and ranges such as 0-3,7`,
      );
    },
    2 * CHILD_MS,
  );

  it(
    "thousands of lines of the largest range are refused once the file's hosts pass the limit",
    async () => {
      const lines = Array.from({ length: 4096 }, (_, s) => `SwitchName=s${s} Nodes=s${s}n[0-${MAX_HOSTS - 1}]`);
      const conf = write("many.conf", `${lines.join("\n")}\n`);
      expectRefused(
        await slurm(conf),
        "slurm",
        `topology ${conf} at line 2: the Nodes= lists so far name more than ${MAX_HOSTS} hosts, the most MonkeyTree supports`,
      );
    },
    CHILD_MS,
  );

  it(
    "a rack listing the largest range thousands of times is refused past a rack's hosts",
    async () => {
      const racks = [{ name: "r0", hosts: new Array<string>(MAX_HOSTS).fill(`n[0-${MAX_HOSTS - 1}]`) }];
      const topology = write("wide.json", JSON.stringify({ gpusPerHost: 8, uplinksPerRack: 1, racks }));
      expectRefused(
        await slurm(topology),
        "slurm",
        `topology ${topology} at racks[0].hosts: rack "r0" has more than ${MAX_HOSTS_PER_RACK} hosts, the most MonkeyTree supports`,
      );
    },
    CHILD_MS,
  );
});

describe("a topology document too large to parse", () => {
  const tiny = (bytes: number) => `gpusPerHost: 8\nuplinksPerRack: 1\nracks:\n  - name: r\n    hosts:\n${"      - a\n".repeat(Math.floor(bytes / 10))}`;

  it(
    "a YAML file past the byte cap is refused unparsed",
    async () => {
      const topology = write("big.yaml", tiny(15 * 2 ** 20));
      expectRefused(await slurm(topology), "slurm", `topology ${topology}: it holds more than the ${MAX_TOPOLOGY_BYTES} bytes a topology may have`);
    },
    CHILD_MS,
  );

  it(
    "a YAML file under the cap but of millions of tiny nodes is refused before the document is built",
    async () => {
      const topology = write("nodes.yaml", tiny(MAX_TOPOLOGY_BYTES - 4096));
      const started = performance.now();
      expectRefused(
        await slurm(topology),
        "slurm",
        `topology ${topology}: it holds more than 400000 YAML tokens, far more than the largest topology MonkeyTree supports`,
      );
      // Building this document took 8 s and 490 MB; counting its tokens takes a fraction of that.
      expect(performance.now() - started).toBeLessThan(CHILD_MS / 2);
    },
    CHILD_MS,
  );
});

describe("a topology.conf whose switches loop", () => {
  it.each([
    ["lists itself", "SwitchName=a Switches=a,l\nSwitchName=l Nodes=n[0-1]\n", 'line 1: Switches= go round in a loop, "a" → "a"'],
    ["A → B → A", "SwitchName=a Switches=b\nSwitchName=b Switches=a,l\nSwitchName=l Nodes=n[0-1]\n", 'line 1: Switches= go round in a loop, "a" → "b" → "a"'],
    [
      "A → B → C → A above a tree",
      "SwitchName=t Switches=l\nSwitchName=l Nodes=n[0-1]\nSwitchName=a Switches=b\nSwitchName=b Switches=c\nSwitchName=c Switches=a\n",
      'line 3: Switches= go round in a loop, "a" → "b" → "c" → "a"',
    ],
  ])(
    "a switch that %s is refused, naming the loop",
    async (_, text, message) => {
      const conf = write("loop.conf", text);
      expectRefused(await slurm(conf), "slurm", `topology ${conf} at ${message}; a tree's switches lead down to the racks without one`);
    },
    CHILD_MS,
  );
});

describe("a simulation input past what a run replays", () => {
  const job = (i: number, arrival: number) => JSON.stringify({ id: `j${i}`, arrival, hostsPerStage: 1, iterations: 1, computeSeconds: 0.1, ringBytes: 0 });

  it(
    "a trace of more jobs than a run replays is refused, saying how to split it",
    async () => {
      const trace = write("long.jsonl", `${Array.from({ length: MAX_TRACE_JOBS + 1 }, (_, i) => job(i, i)).join("\n")}\n`);
      expectRefused(
        await monkeytree("simulate", "--trace", trace, "--systems", "perfect"),
        "simulate",
        `trace ${trace}: more than ${MAX_TRACE_JOBS} jobs; a run replays at most ${MAX_TRACE_JOBS}: split the trace by arrival into files of at most ${MAX_TRACE_JOBS} lines and simulate each`,
      );
      const usage = await monkeytree("simulate", "--jobs", String(MAX_TRACE_JOBS + 1), "--systems", "perfect");
      expect(usage.stderr).toContain(`--jobs must be a whole number from 1 to ${MAX_TRACE_JOBS}, got "${MAX_TRACE_JOBS + 1}"`);
      expect(usage.code).toBe(2);
    },
    2 * CHILD_MS,
  );

  it(
    "an sacct dump of 130,000 jobs that ran is refused, not an internal RangeError",
    async () => {
      const jobs = Array.from({ length: 130_000 }, (_, i) => ({
        job_id: i + 1,
        comment: "monkeytree:model=gpt3-7b",
        allocation_nodes: 1,
        time: { submission: 1_000 + i, elapsed: 60 },
        tres: { allocated: [{ type: "gres", name: "gpu", count: 8 }] },
      }));
      const sacct = write("sacct.json", JSON.stringify({ jobs }));
      expectRefused(
        await monkeytree("simulate", "--from-sacct", sacct, "--systems", "perfect"),
        "simulate",
        `sacct ${sacct} at jobs: 130000 jobs ran on GPUs; a run replays at most ${MAX_TRACE_JOBS}: dump a shorter period (sacct --json --starttime … --endtime …) and simulate each`,
      );
    },
    CHILD_MS,
  );

  it(
    "an arrival past ten years is refused naming the line and field",
    async () => {
      const trace = write("late.jsonl", `${job(0, 0)}\n\n${job(1, 1e308)}\n`);
      expectRefused(
        await monkeytree("simulate", "--trace", trace, "--systems", "perfect"),
        "simulate",
        `trace ${trace} line 3 at arrival: arrival must be at most ${MAX_TRACE_SECONDS} s (ten years)`,
      );
    },
    CHILD_MS,
  );
});
