package main

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on Linux.
const clockTicks = 100

// cpuUse is CPU time consumed so far, in seconds, by component.
type cpuUse struct {
	Postgres float64 `json:"postgres"` // every postgres process on the machine (the benchmark's cluster is the only one)
	Services float64 `json:"services"` // the service processes
	Bench    float64 `json:"bench"`    // this process: the paying clients, and kfake when it is the broker
	Broker   float64 `json:"broker"`   // Apache Kafka's JVM, when it is the broker
}

func (c cpuUse) total() float64 { return c.Postgres + c.Services + c.Bench + c.Broker }

func (c cpuUse) sub(d cpuUse) cpuUse {
	return cpuUse{c.Postgres - d.Postgres, c.Services - d.Services, c.Bench - d.Bench, c.Broker - d.Broker}
}

// scaled multiplies every component by k (1/seconds: cores busy).
func (c cpuUse) scaled(k float64) cpuUse {
	return cpuUse{c.Postgres * k, c.Services * k, c.Bench * k, c.Broker * k}
}

// per1000 scales CPU seconds to seconds per 1,000 round trips.
func (c cpuUse) per1000(n int) cpuUse {
	k := 1000 / float64(n)
	return cpuUse{c.Postgres * k, c.Services * k, c.Bench * k, c.Broker * k}
}

// cpuSeconds reads the CPU time consumed so far by the given service
// processes, by the broker's processes (none for kfake, which runs in this
// one), by every postgres process and by this process.
func cpuSeconds(pids, brokerPids []int) cpuUse {
	var use cpuUse
	seen := map[int]bool{}
	for _, pid := range pids {
		seen[pid] = true
		use.Services += procCPU(pid)
	}
	for _, pid := range brokerPids {
		seen[pid] = true
		use.Broker += procCPU(pid)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || seen[pid] {
			continue
		}
		if comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.TrimSpace(string(comm)) == "postgres" {
			// With its exited children's: a backend whose connection closed
			// takes its time to the postmaster, instead of out of the sum.
			use.Postgres += procCPU(pid) + childrenCPU(pid)
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		use.Bench = float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
	}
	return use
}

// procCPU reads utime+stime of one process.
func procCPU(pid int) float64 { return statSeconds(pid, 11, 12) }

// childrenCPU reads cutime+cstime of one process: the time of its children
// that exited and were waited for.
func childrenCPU(pid int) float64 { return statSeconds(pid, 13, 14) }

// statSeconds adds fields of /proc/<pid>/stat (counted from the state, the
// first after the command name), in clock ticks, and returns seconds.
func statSeconds(pid int, fields ...int) float64 {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; fields start after its closing paren.
	s := string(data)
	all := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	var ticks float64
	for _, f := range fields {
		if f >= len(all) {
			return 0
		}
		v, _ := strconv.ParseFloat(all[f], 64)
		ticks += v
	}
	return ticks / clockTicks
}

func sortedGoals(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
