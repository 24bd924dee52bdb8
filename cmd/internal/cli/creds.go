package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/mesh"
)

func init() { extraCommands = append(extraCommands, credsCmd) }

func credsCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "creds",
		Short: "Keep the mesh's NATS keys and issue credentials whose permissions are a principal's derived set",
		Long: `Keep the mesh's NATS keys and issue each principal its credentials.

init makes a key directory: an operator, the mesh's account (JetStream on) and
a system account, and server.conf, which a NATS server (every server of a
cluster) includes to trust them. issue writes a .creds file for one principal
whose permissions are exactly the set its declaration derives (see
` + "`builds catalogue show`" + `), signed with the account's key. A node's set is
its own plus the buckets of the modules its runtime may carry (--carries,
build-agent by default): their own state to write, their reads to read.`,
		Example: `  builds creds init /etc/meshbuild/nats --server-conf /etc/nats/nats-server.conf
  # in /etc/nats/nats-server.conf (relative to its own directory): include ../meshbuild/nats/server.conf
  builds creds issue /etc/meshbuild/nats --catalogue catalogue --principal controller --out controller.creds
  builds creds issue /etc/meshbuild/nats --catalogue catalogue --principal node m1 --out m1.creds
  builds creds issue /etc/meshbuild/nats --catalogue catalogue --principal node m2 --carries build-agent,scanner --out m2.creds
  builds creds issue /etc/meshbuild/nats --catalogue catalogue --principal agent m1 --out agent-m1.creds`,
	}
	var serverConf string
	initCmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Make the operator, account and system keys in DIR, and DIR/server.conf",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := creds.Init(args[0])
			if err != nil {
				return err
			}
			conf := filepath.Join(k.Dir, creds.ServerConf)
			fmt.Fprintf(g.out, "Keys made in %s (the .nk files are secret: keep them there, mode 0600).\n", k.Dir)
			fmt.Fprintf(g.out, "Server configuration: %s\n", conf)
			// nats-server reads an include relative to the directory of
			// the file that includes it — an absolute path too — so the
			// line to paste depends on where that file is.
			at, where := serverConf, "the nats-server configuration "+serverConf
			if at == "" {
				at, where = creds.ServerConf, "a nats-server configuration in the current directory"
			}
			line, err := includeLine(conf, at)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.out, "  include it in every NATS server's configuration, beside jetstream {…}; nats-server reads an include relative to the directory of the file that includes it (even a path starting with /), so for %s write:\n  %s\n", where, line)
			if serverConf == "" {
				fmt.Fprintf(g.out, "  (--server-conf FILE prints the line for the configuration FILE)\n")
			}
			fleet := mesh.FleetSettingsOf(mesh.DefaultFleet)
			fmt.Fprintf(g.out, "  for a fleet of up to %d machines give each server jetstream { request_queue_limit: %d } (a fleet starting at once fills the default of %d, and the server drops every request queued) and ulimit -n %d (mesh.FleetSettingsOf)\n",
				mesh.DefaultFleet.Machines, fleet.APIQueueLimit, mesh.ServerAPIQueueLimit, fleet.NoFile)
			fmt.Fprintf(g.out, "Then issue each principal its credentials: builds creds issue %s --catalogue DIR --principal KIND [NAME] --out FILE\n", k.Dir)
			return nil
		},
	}
	initCmd.Flags().StringVar(&serverConf, "server-conf", "", "the nats-server configuration file that will include DIR/server.conf: the include line is printed for it")
	c.AddCommand(initCmd)
	var kind, name, catalogue, out string
	var carries []string
	issue := &cobra.Command{
		Use:   "issue DIR --principal KIND [NAME] --out FILE",
		Short: "Write the credentials of one principal (controller, operator, agent NAME, node NAME, module NAME)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 || len(args) == 2 {
				return nil
			}
			return argsError(cmd, args, "the key directory, and the principal's name for agent, node and module")
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				if name != "" && name != args[1] {
					return fmt.Errorf("two names, --name %s and %s: give one", name, args[1])
				}
				name = args[1]
			}
			if out == "" {
				return fmt.Errorf("no --out FILE: say where to write the credentials (e.g. %s.creds)", kind)
			}
			named := kind == mesh.KindNode || kind == mesh.KindModule || kind == mesh.KindAgent
			if named && name == "" {
				if kind == mesh.KindAgent {
					return fmt.Errorf("--principal agent needs the build machine's name: every machine has credentials of its own (--principal agent NAME)")
				}
				return fmt.Errorf("--principal %s needs its name: --principal %s NAME", kind, kind)
			}
			if !named && name != "" {
				return fmt.Errorf("--principal %s takes no name (%q): only agent, node and module do", kind, name)
			}
			if kind != mesh.KindNode && cmd.Flags().Changed("carries") {
				return fmt.Errorf("--carries is for --principal node: the modules a node's runtime carries")
			}
			if kind == mesh.KindNode || kind == mesh.KindAgent {
				if err := mesh.ValidMachineName(kind, name); err != nil {
					return err
				}
			}
			k, err := creds.Open(args[0])
			if err != nil {
				return err
			}
			cat := &mesh.Catalogue{}
			switch {
			case catalogue != "":
				if cat, err = loadCatalogue(g, catalogue); err != nil {
					return err
				}
			case kind == mesh.KindNode && len(carries) > 0:
				return fmt.Errorf("no catalogue: node %s carries %s, and the buckets they are issued are derived from it; pass --catalogue DIR (MESHBUILD_CATALOGUE), or --carries '' for a node that carries no module",
					name, strings.Join(carries, ", "))
			case kind != mesh.KindNode:
				return fmt.Errorf("no catalogue: --principal %s's permissions are derived from it; pass --catalogue DIR (MESHBUILD_CATALOGUE)", kind)
			}
			var perms mesh.Permissions
			if kind == mesh.KindNode {
				perms, err = cat.NodePrincipalPermissions(name, carries)
			} else {
				perms, err = cat.PrincipalPermissions(kind, name)
			}
			if err != nil {
				return err
			}
			who := strings.TrimSpace(kind + " " + name)
			if err := k.IssueFile(perms, who, out); err != nil {
				return err
			}
			carrying := ""
			if kind == mesh.KindNode {
				carrying = ", carrying " + strings.Join(carries, ", ")
				if len(carries) == 0 {
					carrying = ", carrying no module"
				}
			}
			fmt.Fprintf(g.out, "%s: credentials of %s%s (account %s): may publish %d subject(s), subscribe %d\n",
				out, who, carrying, k.Account(), len(perms.Publish), len(perms.Subscribe))
			if n, err := creds.JWTSize(out); err == nil && n > creds.ConnectJWTBudget {
				fmt.Fprintf(g.errw, "warning: %s: its JWT is %d bytes; a client sends it in its CONNECT, which a server refuses beyond its max_control_line (4096 bytes by default: \"maximum control line exceeded\"): set max_control_line: %d on every server\n",
					out, n, (n+1024+1023)/1024*1024)
			}
			return nil
		},
	}
	f := issue.Flags()
	f.StringVar(&kind, "principal", "", "who the credentials speak for: "+strings.Join(mesh.PrincipalKinds, ", "))
	f.StringVar(&name, "name", "", "the node's or module's name (or give it after --principal KIND)")
	f.StringVar(&catalogue, "catalogue", os.Getenv("MESHBUILD_CATALOGUE"), "catalogue directory the permissions are derived from (env MESHBUILD_CATALOGUE; not needed for a node)")
	f.StringVar(&out, "out", "", "file to write the credentials to (mode 0600)")
	f.StringSliceVar(&carries, "carries", mesh.NodeCarries, "for a node: the modules its runtime may carry; it is granted the buckets they are issued (their own state to write, their reads to read) and no other")
	_ = issue.MarkFlagRequired("principal")
	c.AddCommand(issue)
	return c
}

// includeLine is the line a nats-server configuration at serverConf writes
// to include conf: the path of conf relative to serverConf's directory,
// which is how nats-server resolves it.
func includeLine(conf, serverConf string) (string, error) {
	absConf, err := filepath.Abs(conf)
	if err != nil {
		return "", err
	}
	absServer, err := filepath.Abs(serverConf)
	if err != nil {
		return "", fmt.Errorf("--server-conf %s: %w", serverConf, err)
	}
	rel, err := filepath.Rel(filepath.Dir(absServer), absConf)
	if err != nil {
		return "", fmt.Errorf("%s cannot be named relative to %s: %w", absConf, filepath.Dir(absServer), err)
	}
	return "include " + filepath.ToSlash(rel), nil
}
