package mesh_test

import (
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshbuild/meshbuild/mesh"
)

type natsServerOptions struct{ users []*server.User }

func (o *natsServerOptions) add(p mesh.Permissions) {
	o.users = append(o.users, &server.User{Username: p.Principal, Password: "pw-" + p.Principal, Permissions: p.ServerPermissions()})
}

func (o *natsServerOptions) options() *server.Options { return &server.Options{Users: o.users} }

// containsSubject reports whether a server's permissions error names subject.
func containsSubject(err error, subject string) bool {
	return strings.Contains(err.Error(), `"`+subject+`"`)
}
