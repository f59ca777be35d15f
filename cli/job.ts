import { ClientClosedError, ControllerError, ControllerTimeoutError } from "../sdk/client/client.ts";
import { controllerFlags, operatorClient } from "./status.ts";
import { helpText, parseCommandFlags, required } from "./flags.ts";
import { ExitCode, UsageError, credentialFlag, refusalAdvice, type Command } from "./io.ts";

const FLAGS = {
  job: required("J", "the job to end", "the job to end"),
  ...controllerFlags("an operator credential (operator-NAME.json from `monkeytree keys`), or the job's own"),
};

const help = helpText({
  command: "monkeytree job finish",
  table: FLAGS,
  about: `Ends job J on a running controller, as its launchers do when it completes: its moves in
flight roll back, it is journaled finished, its hosts are free for other jobs, and its
workers are told to stop at their next barrier. An operator ends any job this way, one whose
job credential was revoked included; a job's own credential ends only that job.`,
  after: `exit codes: 0 finished, 2 bad usage, 3 no answer, or a refusal (an unknown job, a credential
that may not end it).`,
});

export const command: Command = {
  summary: "end a job on a running controller (an operator may end any job)",
  help,
  async run(argv, io) {
    const [action, ...rest] = argv;
    if (action !== "finish") throw new UsageError(`expected \`monkeytree job finish --job J\`, got ${action === undefined ? "no action" : `"${action}"`}`);
    const flags = parseCommandFlags(rest, FLAGS);
    const credential = credentialFlag(flags.credentials);
    const { client, refused: refusal } = operatorClient(flags.connect, credential?.credential, flags.timeout);
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
