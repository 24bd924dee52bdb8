package mesh_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

func TestNodeNamesAreOneTokenAndAConsumerName(t *testing.T) {
	for _, ok := range []string{"n1", "build-1", "web-a2"} {
		if err := mesh.ValidNodeName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for name, hint := range map[string]string{
		"":                      "--name",
		"build1.example":        `"build1"`,
		"Build_1":               `"build-1"`,
		"a*b":                   "lowercase",
		strings.Repeat("a", 65): "shorter",
	} {
		err := mesh.ValidNodeName(name)
		if err == nil || !strings.Contains(err.Error(), hint) {
			t.Errorf("%q: %v, want a refusal saying %s", name, err, hint)
		}
	}
	if got := mesh.NodeAckSubject("n1"); got != "$JS.ACK.NODES.n1.>" {
		t.Errorf("n1's ack grant is %s", got)
	}
	spec := mesh.NodeConsumerSpec("n1", 1)
	if spec.Config.Durable != "n1" || spec.Config.FilterSubject != mesh.NodeSubject("n1") || spec.Stream != mesh.NodesStream {
		t.Errorf("n1's consumer %+v", spec)
	}
}

// TestNodePermissionsAreExactlyDerived: the node's set is its own consumer,
// its ack and reset grants, the controller seat's enrol and report, and its inbox and
// answers; a hand-written addition fails here.
func TestNodePermissionsAreExactlyDerived(t *testing.T) {
	p := mesh.NodePermissions("n1")
	wantPub := []string{
		"$JS.ACK.NODES.n1.>",
		"$JS.API.CONSUMER.INFO.NODES.n1",
		"$JS.API.CONSUMER.MSG.NEXT.NODES.n1",
		"$JS.API.CONSUMER.RESET.NODES.n1",
		"mesh.seat.mesh-controller.accept.enrol",
		"mesh.seat.mesh-controller.accept.report",
	}
	wantSub := []string{"_INBOX_node_n1.>", "mesh.node.n1.answer.>"}
	if !slices.Equal(p.Publish, wantPub) || !slices.Equal(p.Subscribe, wantSub) || p.Responses {
		t.Fatalf("n1's permissions\n pub %v\n sub %v\nwant\n pub %v\n sub %v", p.Publish, p.Subscribe, wantPub, wantSub)
	}
}
