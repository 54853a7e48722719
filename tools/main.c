/* main.c: the clnsa command-line tool: dispatch to the subcommands and the
 * top-level usage. */
#include "clnsa.h"
#include "cmds.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary; /* NULL: hidden */
} command;

static const command commands[] = {
    {"devices", cmd_devices, "list OpenCL platforms and devices with their probed properties"},
    {"run", cmd_run, "NSA forward and backward on random inputs: time them and check them against the reference"},
    {"nsa", cmd_nsa, "NSA forward on .npy files, backward too with do.npy (--in DIR --out DIR)"},
    {"blocksparse", cmd_blocksparse, "block-sparse attention on .npy files, backward too with do.npy (--in DIR --out DIR)"},
    {"bench", cmd_bench, "time the NSA per branch and a dense causal baseline at a sweep of T, and the start-up"},
    {"tune", cmd_tune, "search a kernel family's parameters for this device; --merge folds results into tuning/"},
    {"compare", cmd_compare, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: clnsa <command> [options]   (clnsa <command> --help for its options)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i)
        if (commands[i].summary) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nThe device defaults to $CLNSA_DEVICE (P:D, as listed by clnsa devices), else the first GPU,\n"
               "else PoCL's CPU device, else the first device. clnsa --version prints the library version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("clnsa %s\n", clnsa_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i)
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].fn(argc, argv);
    fprintf(stderr, "clnsa: unknown command '%s' (see clnsa --help)\n", cmd);
    return 2;
}
