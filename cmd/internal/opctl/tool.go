package opctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Tool is the frame of an operator command: its name, its usage, and the
// database DATABASE_URL names. Its commands are the tool's own.
type Tool struct {
	Name     string // "inboxctl"
	Usage    string // printed for help and after every command line that does not parse
	Database string // what DATABASE_URL names: "the consumer's database"
}

// Main runs run with the program's arguments, standard output and
// environment, under a context that ends on SIGINT or SIGTERM, and exits 1
// with the tool's name and run's error.
func (t Tool) Main(run func(ctx context.Context, args []string, out io.Writer, getenv func(string) string) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Getenv)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", t.Name, err)
		os.Exit(1)
	}
}

// Parse reads args as one of commands and its flags, defined on fs by the
// caller, and returns the command and its other arguments. help is true
// when the user asked for the usage: Parse has printed it to out.
func (t Tool) Parse(fs *flag.FlagSet, args []string, out io.Writer, commands ...string) (cmd string, rest []string, help bool, err error) {
	if len(args) == 0 {
		return "", nil, false, errors.New(t.Usage)
	}
	cmd = args[0]
	switch {
	case slices.Contains(commands, cmd):
	case slices.Contains([]string{"help", "-h", "-help", "--help"}, cmd):
		fmt.Fprintln(out, t.Usage)
		return cmd, nil, true, nil
	default:
		return "", nil, false, fmt.Errorf("unknown command %q\n%s", cmd, t.Usage)
	}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args[1:]); err != nil {
		return "", nil, false, fmt.Errorf("%v\n%s", err, t.Usage)
	}
	return cmd, fs.Args(), false, nil
}

// NoArgs refuses arguments to a command that takes none.
func (t Tool) NoArgs(cmd string, rest []string) error {
	if len(rest) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q\n%s", cmd, rest, t.Usage)
	}
	return nil
}

// ID reads the one row ID a command takes.
func (t Tool) ID(cmd string, rest []string) (int64, error) {
	if len(rest) != 1 {
		return 0, fmt.Errorf("%s needs one ID (see %s list)\n%s", cmd, t.Name, t.Usage)
	}
	id, err := strconv.ParseInt(rest[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: ID %q is not a number", cmd, rest[0])
	}
	return id, nil
}

// Connect opens the database DATABASE_URL names. With a timeout, the
// returned context ends after it (a command that may take what it takes,
// such as a retire of millions of rows, passes 0: ^C stops it); close
// releases both.
func (t Tool) Connect(ctx context.Context, getenv func(string) string, timeout time.Duration) (_ context.Context, _ *pgxpool.Pool, close func(), err error) {
	url := getenv("DATABASE_URL")
	if url == "" {
		return nil, nil, nil, fmt.Errorf("DATABASE_URL is required: %s", t.Database)
	}
	cancel := func() {}
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		cancel()
		return nil, nil, nil, fmt.Errorf("connecting: %w", err)
	}
	return ctx, pool, func() { pool.Close(); cancel() }, nil
}
