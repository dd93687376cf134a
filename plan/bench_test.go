package plan

import (
	"os"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/layout"
)

func kimi(b testing.TB) ([]layout.Tensor, layout.Model) {
	data, err := os.ReadFile("../layout/testdata/kimi-k2.config.json")
	if err != nil {
		b.Fatal(err)
	}
	c, err := layout.ParseHFConfig(data)
	if err != nil {
		b.Fatal(err)
	}
	return c.Tensors(dtype.BF16), c.Model()
}

// BenchmarkPlanKimiK2 plans Kimi-K2 from 256 FSDP trainer GPUs to 16
// rollout replicas of TP 8 (128 GPUs).
func BenchmarkPlanKimiK2(b *testing.B) {
	ts, m := kimi(b)
	snd, err := layout.NewParallel(ts, nil, m, layout.Spec{Ranks: 256, FSDP: true})
	if err != nil {
		b.Fatal(err)
	}
	rcv, err := layout.NewParallel(ts, nil, m, layout.Spec{Ranks: 128, TP: 8})
	if err != nil {
		b.Fatal(err)
	}
	links := Links{GPUsPerNode: 8, NIC: 50e9, NVLink: 450e9, Latency: 20e-6}
	var p *Plan
	for b.Loop() {
		if p, err = Make(snd, rcv, links); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(p.Groups)), "groups")
	b.ReportMetric(p.Stats.PredictedSeconds, "predicted-s")
}
