/**
 * The user's torchrun command line, adapted for `monkeytree launch`: the launcher owns the
 * cross-host rendezvous (the hook forms the job's process group from the controller's
 * assignment), so each host's torchrun is a single-node job with a rendezvous of its own, and
 * flags that would set up a multi-node rendezvous are refused rather than silently overridden.
 * Its store listens on a port the kernel picks as it binds (`--master_port=0`): a free port
 * chosen before torchrun starts could be taken by the time torchrun, seconds later, binds it.
 * The processes' own group never uses that store: the hook forms it from the assignment.
 */
import { MAX_GPUS_PER_HOST } from "../../contract/protocol/limits.ts";

/** torchrun flags the launcher sets itself; both spellings torchrun accepts. */
const OWNED = ["nnodes", "node-rank", "master-addr", "master-port", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "standalone", "max-restarts"];

export class TorchrunArgsError extends Error {
  override readonly name = "TorchrunArgsError";
}

export interface TorchrunCommand {
  /** The program and its arguments as the user gave them. */
  readonly argv: readonly string[];
  /** Processes torchrun starts on this host (`--nproc-per-node`, default 1). */
  readonly nprocPerNode: number;
  /** The command to run: a single-node torchrun with a rendezvous store of its own. */
  readonly local: readonly string[];
}

const flagName = (arg: string): string | null => (arg.startsWith("--") ? arg.slice(2).split("=")[0]!.replaceAll("_", "-") : null);

/** Modules that run torchrun: `python -m torch.distributed.run ARGS` is torchrun too. */
const LAUNCH_MODULES = new Set(["torch.distributed.run"]);

export function adaptTorchrun(argv: readonly string[]): TorchrunCommand {
  if (argv[0] === undefined) throw new TorchrunArgsError("no command after `--`; give the torchrun command line, e.g. -- torchrun --nproc-per-node 8 train.py");
  const launcher = argv[1] === "-m" && LAUNCH_MODULES.has(argv[2] ?? "") ? 3 : 1;
  const program = argv.slice(0, launcher);
  const rest = argv.slice(launcher);
  let nprocPerNode = 1;
  // torchrun's own options come before the training script; everything after belongs to the script.
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i]!;
    if (!arg.startsWith("-")) break;
    const name = flagName(arg);
    if (name === null) continue;
    if (OWNED.includes(name)) {
      throw new TorchrunArgsError(
        `remove --${name} from the torchrun command: monkeytree launch sets up the job's rendezvous from the controller's ring order`,
      );
    }
    const inline = arg.includes("=");
    const value = inline ? arg.slice(arg.indexOf("=") + 1) : VALUED.has(name) ? rest[++i] : undefined;
    if (name === "nproc-per-node") {
      const count = Number(value);
      if (!Number.isInteger(count) || count < 1 || count > MAX_GPUS_PER_HOST) {
        throw new TorchrunArgsError(
          `--nproc-per-node must be a whole number of processes from 1 to ${MAX_GPUS_PER_HOST} (monkeytree launch needs it explicit), got "${value}"`,
        );
      }
      nprocPerNode = count;
    }
  }
  const local = [...program, "--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=0", ...rest];
  return { argv: [...argv], nprocPerNode, local };
}

/** torchrun options that take a separate value. */
const VALUED = new Set(["nproc-per-node", "monitor-interval", "start-method", "role", "log-dir", "redirects", "tee", "local-addr", "run-path"]);
