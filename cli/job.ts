import { ClientClosedError, ControllerError, ControllerTimeoutError } from "../sdk/client/client.ts";
import { operatorClient } from "./status.ts";
import { CREDENTIALS_ENV, ExitCode, UsageError, addressFlag, credentialFlag, parseFlags, refusalAdvice, secondsFlag, type Command } from "./io.ts";

const help = `usage: monkeytree job finish --job J [--connect ADDR] [--credentials FILE] [--timeout S]

Ends job J on a running controller, as its launchers do when it completes: its moves in
flight roll back, it is journaled finished, its hosts are free for other jobs, and its
workers are told to stop at their next barrier. An operator ends any job this way, one whose
job credential was revoked included; a job's own credential ends only that job.

options:
  --job J             the job to end (required)
  --connect ADDR      controller address (default tcp://127.0.0.1:5555)
  --credentials FILE  an operator credential (operator-NAME.json from \`monkeytree keys\`), or
                      the job's own; required when the controller has a keyring; default
                      $${CREDENTIALS_ENV}
  --timeout S         give up after S seconds (default 5)
  -h, --help          show this help

exit codes: 0 finished, 2 bad usage, 3 no answer, or a refusal (an unknown job, a credential
that may not end it).`;

export const command: Command = {
  summary: "end a job on a running controller (an operator may end any job)",
  help,
  async run(argv, io) {
    const [action, ...rest] = argv;
    if (action !== "finish") throw new UsageError(`expected \`monkeytree job finish --job J\`, got ${action === undefined ? "no action" : `"${action}"`}`);
    const flags = parseFlags(rest, { job: { type: "string" }, connect: { type: "string" }, credentials: { type: "string" }, timeout: { type: "string" } });
    if (flags.job === undefined) throw new UsageError("--job is required: the job to end");
    const timeoutMs = secondsFlag("timeout", flags.timeout, 5, 0.1);
    const endpoint = addressFlag("--connect", flags.connect ?? "tcp://127.0.0.1:5555", "connect");
    const credential = credentialFlag(flags.credentials);
    const { client, refused: refusal } = operatorClient(endpoint, credential?.credential, timeoutMs);
    try {
      await client.finish(flags.job);
      io.out.write(`job ${JSON.stringify(flags.job)} finished\n`);
      return ExitCode.ok;
    } catch (error) {
      const refused = refusal();
      if (refused && error instanceof ClientClosedError) {
        io.err.write(`monkeytree job: ${refusalAdvice(refused, credential?.path, "the operator-NAME.json that `monkeytree keys --operator NAME` wrote")}\n`);
        return ExitCode.internal;
      }
      if (!(error instanceof ControllerError || error instanceof ControllerTimeoutError)) throw error;
      io.err.write(`monkeytree job: ${error.message}\n`);
      return ExitCode.internal;
    } finally {
      await client.close();
    }
  },
};
