// ESLint for every source file of the repository (`npm run lint`; `npm test` runs it between tsc and mocha).
// TypeScript gets typescript-eslint's recommended type-checked rules (no-floating-promises and no-misused-promises
// among them), read through the same tsconfig.json as tsc. The few plain JavaScript files (the dashboard, the bin
// stubs, mocha's reporter and preload) get ESLint's recommended rules with the globals of where they run; they are
// not type-checked (tsconfig has no allowJs), so the promise rules cannot see them. docs/testing.md says why.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

const ANY_RULES = ['no-explicit-any', 'no-unsafe-argument', 'no-unsafe-assignment', 'no-unsafe-call',
  'no-unsafe-member-access', 'no-unsafe-return'].map((r) => `@typescript-eslint/${r}`);
const UNTYPED_OFF = Object.fromEntries(ANY_RULES.map((r) => [r, 'off']));

export default tseslint.config(
  { ignores: ['node_modules/', 'dist/', '.data/', 'test/artifacts/'] },
  {
    files: ['**/*.ts'],
    extends: [js.configs.recommended, ...tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // A leading underscore names a parameter or binding kept on purpose (a callback's position, a key dropped
      // from a rest copy); everything else unused is an error.
      '@typescript-eslint/no-unused-vars': ['error', {
        argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_',
        destructuredArrayIgnorePattern: '^_', ignoreRestSiblings: true,
      }],
      // Values typed `any` (parsed JSON answers, test responses) are still in test/: the six rules that forbid and
      // follow an `any` are on where the values are typed (services/, queue/, shared/ and scripts/, below) and off
      // here until they are (issue 22's follow-up).
      ...UNTYPED_OFF,
    },
  },
  {
    // Typed through: every value has a declared type (a cast at a library's boundary says why).
    files: ['queue/**/*.ts', 'shared/**/*.ts', 'services/**/*.ts', 'scripts/**/*.ts'],
    rules: Object.fromEntries(ANY_RULES.map((r) => [r, 'error'])),
  },
  {
    files: ['**/*.js', '**/*.cjs', '**/*.mjs'],
    extends: [js.configs.recommended],
    languageOptions: { globals: globals.node, sourceType: 'commonjs' },
  },
  { files: ['**/*.mjs'], languageOptions: { sourceType: 'module' } },
  {
    // The dashboard runs in the browser as ES modules.
    files: ['services/daemon/web/**/*.js'],
    languageOptions: { globals: globals.browser, sourceType: 'module' },
  },
);
