package plan

import (
	"cmp"
	"slices"
)

// Stats are a plan's byte counts and its time on the link model.
type Stats struct {
	Bytes    int64   // bytes all receivers take, together
	Moves    int64   // regions moved (tensor × region × receiver)
	Streams  int     // sender–receiver pairs with bytes between them
	Sent     []int64 // bytes each sender sends
	Received []int64 // bytes each receiver takes

	SentMax      int64
	SentMean     float64
	ReceivedMax  int64
	ReceivedMean float64

	LinkBytesMax int64  // the most bytes any one link carries
	BusiestLink  string // the link that finishes last, "sender 3 NIC out"

	// PredictedSeconds is the time of the busiest link: the most, over
	// links, of its bytes over its speed plus Links.Latency for each
	// sender–receiver pair that uses it.
	PredictedSeconds float64
	// BoundSeconds is a lower bound on the time of any plan for these
	// layouts and links, the largest of: for each receiver, the bytes it
	// needs (less those its own GPU could hold, colocated) over the speed
	// of every link it can receive on (its NIC, plus NVLink when a sender
	// shares its node); all those bytes over the sending speed of every
	// sender together; and, for each sender, the bytes that only it holds,
	// over its sending speed. Bound names the term that gives it.
	BoundSeconds float64
	Bound        string
}

type item struct {
	g, j, region int
	bytes        int64
}

// balance chooses a holder for every region with several, and fills Stats.
func (p *Plan) balance() {
	tp := newTopo(p.Links, p.Senders)
	ngpu := max(p.Senders, tp.recvBase+p.Receivers)
	load := make([]int64, ngpu*linksPerGPU)
	add := func(s, r int, b int64) {
		out, in := tp.pair(s, r)
		if out != local {
			load[out] += b
			load[in] += b
		}
	}
	st := &p.Stats
	st.Sent = make([]int64, p.Senders)
	st.Received = make([]int64, p.Receivers)
	forced := make([]int64, p.Senders)     // bytes only this sender holds, leaving its GPU
	localCan := make([]int64, p.Receivers) // bytes a colocated receiver's own GPU holds
	var items []item
	for gi := range p.Groups {
		g := &p.Groups[gi]
		n := int64(len(g.Tensors))
		es := int64(p.Tensors[g.Tensors[0]].DType.Size())
		k := 0
		for ri := range g.Regions {
			r := &g.Regions[ri]
			b := r.Region.Elements() * es
			st.Received[r.Receiver] += b * n
			st.Moves += n
			if p.Links.Colocated {
				for _, h := range r.Holders {
					if h.Sender == r.Receiver {
						localCan[r.Receiver] += b * n
						break
					}
				}
			}
			if len(r.Holders) == 1 {
				s := r.Holders[0].Sender
				add(s, r.Receiver, b*n)
				st.Sent[s] += b * n
				if out, _ := tp.pair(s, r.Receiver); out != local {
					forced[s] += b * n
				}
				continue
			}
			r.choice = k
			k++
			for j := range g.Tensors {
				items = append(items, item{gi, j, ri, b})
			}
		}
		if k > 0 {
			g.choices = make([][]int, len(g.Tensors))
			for j := range g.choices {
				g.choices[j] = make([]int, k)
			}
		}
	}
	// Greedy by descending size (ties in plan order), then two passes that
	// take each region off its sender and put it where it finishes first.
	slices.SortStableFunc(items, func(a, b item) int { return cmp.Compare(b.bytes, a.bytes) })
	pick := func(it item) int {
		r := &p.Groups[it.g].Regions[it.region]
		best, bestCost := 0, 0.0
		for hi, h := range r.Holders {
			out, in := tp.pair(h.Sender, r.Receiver)
			cost := 0.0
			if out != local {
				cost = max(float64(load[out]+it.bytes)/tp.speed(out), float64(load[in]+it.bytes)/tp.speed(in))
			}
			if hi == 0 || cost < bestCost {
				best, bestCost = hi, cost
			}
		}
		return best
	}
	for _, it := range items {
		g := &p.Groups[it.g]
		r := &g.Regions[it.region]
		h := pick(it)
		g.choices[it.j][r.choice] = h
		add(r.Holders[h].Sender, r.Receiver, it.bytes)
	}
	for range 2 {
		for _, it := range items {
			g := &p.Groups[it.g]
			r := &g.Regions[it.region]
			old := g.choices[it.j][r.choice]
			add(r.Holders[old].Sender, r.Receiver, -it.bytes)
			h := pick(it)
			g.choices[it.j][r.choice] = h
			add(r.Holders[h].Sender, r.Receiver, it.bytes)
		}
	}
	for _, it := range items {
		g := &p.Groups[it.g]
		r := &g.Regions[it.region]
		st.Sent[r.Holders[g.choices[it.j][r.choice]].Sender] += it.bytes
	}
	p.stats(tp, load, forced, localCan)
}

// stats fills the byte counts, the predicted time and the bound.
func (p *Plan) stats(tp topo, load, forced, localCan []int64) {
	st := &p.Stats
	pairs := map[[2]int]bool{}
	for _, g := range p.Groups {
		for _, r := range g.Regions {
			if r.choice < 0 {
				pairs[[2]int{r.Holders[0].Sender, r.Receiver}] = true
				continue
			}
			for j := range g.Tensors {
				pairs[[2]int{r.Holders[g.choices[j][r.choice]].Sender, r.Receiver}] = true
			}
		}
	}
	st.Streams = len(pairs)
	streams := make([]int, len(load))
	for pr := range pairs {
		if out, in := tp.pair(pr[0], pr[1]); out != local {
			streams[out]++
			streams[in]++
		}
	}
	for _, b := range st.Received {
		st.Bytes += b
		st.ReceivedMax = max(st.ReceivedMax, b)
	}
	var sent int64
	for _, b := range st.Sent {
		sent += b
		st.SentMax = max(st.SentMax, b)
	}
	if p.Senders > 0 {
		st.SentMean = float64(sent) / float64(p.Senders)
	}
	if p.Receivers > 0 {
		st.ReceivedMean = float64(st.Bytes) / float64(p.Receivers)
	}
	for l, b := range load {
		st.LinkBytesMax = max(st.LinkBytesMax, b)
		t := float64(b)/tp.speed(l) + float64(streams[l])*p.Links.Latency
		if t > st.PredictedSeconds {
			st.PredictedSeconds, st.BusiestLink = t, tp.describe(l)
		}
	}
	// The bound.
	nvTo := func(gpu int, others func(int) bool) bool {
		if p.Links.gpn() <= 1 {
			return false
		}
		n := tp.node(gpu)
		for o := n * p.Links.gpn(); o < (n+1)*p.Links.gpn(); o++ {
			if o != gpu && others(o) {
				return true
			}
		}
		return false
	}
	isSender := func(gpu int) bool { return gpu < p.Senders }
	isReceiver := func(gpu int) bool { return gpu >= tp.recvBase && gpu < tp.recvBase+p.Receivers }
	bound := func(t float64, what string) {
		if t > st.BoundSeconds {
			st.BoundSeconds, st.Bound = t, what
		}
	}
	var outCap float64
	for s := range p.Senders {
		c := p.Links.NIC
		if nvTo(tp.senderGPU(s), isReceiver) {
			c += p.Links.NVLink
		}
		outCap += c
		bound(float64(forced[s])/c, "the bytes only one sender holds, over its sending speed")
	}
	var need int64
	for r, b := range st.Received {
		c := p.Links.NIC
		if nvTo(tp.receiverGPU(r), isSender) {
			c += p.Links.NVLink
		}
		need += b - localCan[r]
		bound(float64(b-localCan[r])/c, "the bytes one receiver needs, over its receiving speed")
	}
	if outCap > 0 {
		bound(float64(need)/outCap, "all bytes over all senders' sending speed")
	}
}
