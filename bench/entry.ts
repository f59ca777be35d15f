import { programOptions } from "../cli/flags.ts";

/**
 * A benchmark's command line: `--help` or `-h` prints its usage, whatever else is given; a bad
 * flag prints the reason and the usage and exits 2; otherwise `run` gets the parsed options and
 * returns the exit code.
 */
export async function benchMain<Options>(
  name: string,
  help: string,
  parse: (argv: string[]) => Options,
  run: (options: Options) => Promise<number> | number,
): Promise<void> {
  const options = programOptions(`bench:${name}`, help, parse);
  if (options !== undefined) process.exitCode = await run(options);
}
