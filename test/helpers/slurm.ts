import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "./net.ts";
import { SAFETY_NET_MS } from "./wait.ts";
import { killByEnvironment } from "../../cli/demo/processes.ts";

/**
 * A real Slurm cluster on this machine from Debian's packages (SLURM.md): munged with a key of
 * its own, slurmctld, and one slurmd per emulated node, all on localhost with unique ports
 * and everything under one temporary directory. Nodes n0…n(N-1), `racks` leaf switches of
 * equal size under one top switch in topology.conf. `stop()` kills what it started.
 */

/** Debian puts the daemons in /usr/sbin, which a non-login PATH may lack. */
export function withSbin(env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const path = env.PATH ?? "/usr/bin:/bin";
  return { ...env, PATH: path.includes("/usr/sbin") ? path : `${path}:/usr/sbin:/sbin` };
}

type Falsy<T> = T | undefined | null | false;

export interface SlurmCluster {
  readonly dir: string;
  readonly conf: string;
  readonly nodes: readonly string[];
  /** The environment the client commands need (SLURM_CONF). */
  readonly env: NodeJS.ProcessEnv;
  /** Runs a client command; throws with its output when it fails. */
  run(command: string, ...args: string[]): string;
  /** Submits `sbatch ARGS --wrap SCRIPT` and returns the job id. */
  sbatch(script: string, ...args: string[]): string;
  /** Polls `check` (every 200 ms) until it returns a value, for at most `timeoutMs` (a safety net). */
  until<T>(what: string, check: () => Falsy<T> | Promise<Falsy<T>>, timeoutMs?: number): Promise<T>;
  /**
   * Stops slurmctld and starts it again on its saved state: with SIGTERM, which saves its state
   * first (as `systemctl restart`), or SIGKILL, a crash, which loses what it had not saved yet.
   */
  restartController(signal?: "SIGTERM" | "SIGKILL"): Promise<void>;
  /** Kills everything it started and removes its directory. */
  stop(): void;
}

export interface SlurmClusterOptions {
  readonly nodes?: number;
  readonly racks?: number;
}

export async function startSlurm(options: SlurmClusterOptions = {}): Promise<SlurmCluster> {
  const count = options.nodes ?? 4;
  const racks = options.racks ?? 2;
  const perRack = count / racks;
  if (!Number.isInteger(perRack)) throw new Error(`${count} nodes do not split into ${racks} equal racks`);
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-slurm-"));
  const processes: ChildProcess[] = [];
  let ctld: ChildProcess | undefined;
  const env = withSbin({ ...process.env, SLURM_CONF: join(dir, "slurm.conf") });
  const log = (name: string) => openSync(join(dir, "log", `${name}.out`), "a");

  const stop = () => {
    for (const child of processes) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    // Job steps (slurmstepd and what it runs) are daemonised by slurmd and outlive it.
    killByEnvironment(`SLURM_CONF=${env.SLURM_CONF}`);
    rmSync(dir, { recursive: true, force: true });
  };
  const daemon = (command: string, args: string[], name: string): ChildProcess => {
    const child = spawn(command, args, { env, stdio: ["ignore", log(name), log(name)] });
    processes.push(child);
    return child;
  };

  try {
    for (const sub of ["state", "spool", "log", "munge"]) mkdirSync(join(dir, sub), { recursive: true });
    // munged refuses a key or socket directory others may write; 0755 lets slurm's clients reach the socket.
    chmodSync(join(dir, "munge"), 0o755);
    const key = join(dir, "munge", "munge.key");
    const keygen = spawnSync("mungekey", ["--create", `--keyfile=${key}`], { env, encoding: "utf8" });
    if (keygen.status !== 0) throw new Error(`mungekey: ${keygen.stderr}`);
    const socket = join(dir, "munge", "socket");
    daemon(
      "munged",
      [
        "--foreground",
        "--force",
        `--socket=${socket}`,
        `--key-file=${key}`,
        `--log-file=${join(dir, "log", "munged.log")}`,
        `--pid-file=${join(dir, "munge", "pid")}`,
        `--seed-file=${join(dir, "munge", "seed")}`,
      ],
      "munged",
    );

    const ports: number[] = [];
    for (let i = 0; i < count + 1; i++) ports.push(await freePort());
    const nodes = Array.from({ length: count }, (_, i) => `n${i}`);
    const nodeLines = nodes.map((node, i) => `NodeName=${node} NodeHostname=localhost Port=${ports[i + 1]} CPUs=1 RealMemory=1000 State=UNKNOWN`);
    writeFileSync(
      env.SLURM_CONF!,
      [
        "ClusterName=mt",
        "SlurmctldHost=localhost",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        `AuthInfo=socket=${socket}`,
        "CredType=cred/munge",
        `StateSaveLocation=${dir}/state`,
        `SlurmdSpoolDir=${dir}/spool/%n`,
        `SlurmctldPidFile=${dir}/slurmctld.pid`,
        `SlurmdPidFile=${dir}/slurmd-%n.pid`,
        `SlurmctldLogFile=${dir}/log/ctld.log`,
        `SlurmdLogFile=${dir}/log/%n.log`,
        `SlurmctldPort=${ports[0]}`,
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        // Backfill plans every second, so a node it marked PLANNED for a job that ended clears soon.
        "SchedulerParameters=bf_interval=1",
        "SelectType=select/linear",
        "TopologyPlugin=topology/tree",
        "ReturnToService=2",
        ...nodeLines,
        `PartitionName=p Nodes=${nodes.join(",")} Default=YES MaxTime=INFINITE State=UP`,
        "",
      ].join("\n"),
    );
    const leaves = Array.from({ length: racks }, (_, r) => `SwitchName=r${r} Nodes=${nodes.slice(r * perRack, (r + 1) * perRack).join(",")}`);
    writeFileSync(
      join(dir, "topology.conf"),
      [...leaves, `SwitchName=top Switches=${Array.from({ length: racks }, (_, r) => `r${r}`).join(",")}`, ""].join("\n"),
    );

    const run = (command: string, ...args: string[]): string => {
      const result = spawnSync(command, args, { env, encoding: "utf8", timeout: 30_000 });
      if (result.status !== 0) throw new Error(`${command} ${args.join(" ")}: ${(result.stderr || result.stdout || result.error?.message || "").trim()}`);
      return result.stdout;
    };
    const until = async <T>(what: string, check: () => Falsy<T> | Promise<Falsy<T>>, timeoutMs = SAFETY_NET_MS): Promise<T> => {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        let value: Falsy<T>;
        try {
          value = await check();
        } catch {
          value = undefined;
        }
        if (value !== undefined && value !== null && value !== false) return value;
        if (Date.now() > deadline)
          throw new Error(`Slurm in ${dir}: ${what} did not happen in ${timeoutMs} ms; slurmctld log:\n${tail(join(dir, "log", "ctld.log"))}`);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    };
    const startController = async (clear: boolean) => {
      ctld = daemon("slurmctld", ["-D", ...(clear ? ["-c"] : []), "-f", env.SLURM_CONF!], "slurmctld");
      await until("slurmctld answering", () => run("scontrol", "ping").includes("UP"));
    };
    const idle = () =>
      run("sinfo", "-h", "-N", "-o", "%N %t")
        .trim()
        .split("\n")
        .every((line) => line.endsWith(" idle"));

    await until("munged's socket", () => spawnSync("sh", ["-c", `test -S ${socket}`]).status === 0);
    await startController(true);
    for (const node of nodes) daemon("slurmd", ["-D", "-N", node, "-f", env.SLURM_CONF!], `slurmd-${node}`);
    await until(`nodes ${nodes.join(", ")} idle`, idle);

    return {
      dir,
      conf: env.SLURM_CONF!,
      nodes,
      env,
      run,
      sbatch: (script, ...args) =>
        run("sbatch", "--parsable", "-o", "/dev/null", ...args, "--wrap", script)
          .trim()
          .split(";")[0]!,
      until,
      async restartController(signal = "SIGTERM") {
        ctld?.kill(signal);
        if (ctld && ctld.exitCode === null && ctld.signalCode === null) await new Promise((resolve) => ctld!.once("exit", resolve));
        await startController(false);
      },
      stop,
    };
  } catch (error) {
    stop();
    throw error;
  }
}

function tail(path: string): string {
  try {
    return readFileSync(path, "utf8").split("\n").slice(-20).join("\n");
  } catch {
    return "(no log)";
  }
}
