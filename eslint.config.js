import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["node_modules/", "native/build/", ".scratch/", "dist/", ".venv/"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      // Library code reports through return values, errors and the logger, never the console.
      "no-console": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_" }],
    },
  },
  {
    files: ["bin/**/*.js", "examples/**/*.js", "**/*.mjs"],
    languageOptions: { globals: { process: "readonly", Buffer: "readonly", setTimeout: "readonly", URL: "readonly" } },
  },
);
