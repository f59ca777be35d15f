import { capabilities } from "../native/index.ts";
import { bool, helpText, parseCommandFlags } from "./flags.ts";
import { ExitCode, writeJson, type Command } from "./io.ts";

const FLAGS = { json: bool("print the probe result as JSON") };

const help = helpText({
  command: "monkeytree capabilities",
  table: FLAGS,
  about: `What this host's migration data plane can use: TCP (always), RDMA devices (ibverbs), CUDA and
GPUDirect, and the CRC32C implementation. Absent parts come with the reason.`,
});

export const command: Command = {
  summary: "show what this host's data plane can use (TCP, RDMA, CUDA, GPUDirect)",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const caps = capabilities();
    if (flags.json) {
      await writeJson(io, caps);
      return ExitCode.ok;
    }
    const line = (name: string, part: { present: boolean; devices: readonly unknown[]; reason: string | null }) =>
      `${name.padEnd(10)} ${part.present ? `yes (${part.devices.length} device${part.devices.length === 1 ? "" : "s"})` : `no: ${part.reason ?? "absent"}`}`;
    io.out.write(
      [
        `${"tcp".padEnd(10)} yes`,
        line("rdma", caps.rdma) +
          (caps.rdma.compiled ? " (RDMA WRITE endpoint built; transfers use TCP)" : " (built without libibverbs-dev: no RDMA endpoint; transfers use TCP)"),
        line("cuda", caps.cuda),
        line("gpudirect", caps.gpudirect),
        `${"crc32c".padEnd(10)} ${caps.crc32c}`,
      ].join("\n") + "\n",
    );
    return ExitCode.ok;
  },
};
