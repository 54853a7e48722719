/* cmds.h: the subcommands of the clnsa tool; each takes main's argc/argv
 * (argv[1] is the subcommand's name) and returns the process exit code. */
#ifndef CLNSA_CMDS_H
#define CLNSA_CMDS_H

int cmd_devices(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_nsa(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_blocksparse(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_compare(int argc, char **argv); /* hidden: used by tests/cli_golden.sh */

#endif
