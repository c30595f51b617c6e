// A real single-node Slurm on 127.0.0.1 for one test: munged, slurmctld and slurmd (Debian's packages,
// tools/install-deps.sh) started in the foreground as this test's children with a private munge key,
// socket, state, spool and logs under a temporary directory, on ports picked free. The node is named
// "localhost", so `scontrol show hostnames` gives a name that resolves to 127.0.0.1. stop() (and the
// destructor) cancels every job, waits until the queue is empty, then stops the daemons (SIGTERM, then
// SIGKILL) and reaps them: nothing is left running.
#pragma once
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "common/core/free_port.h"
#include "tests/support/run_command.h"
#include "tests/transfer/process_guard.h"

namespace k3::test {

using k3::free_tcp_port;

class LocalSlurm {
 public:
  explicit LocalSlurm(const std::string& dir) : dir_(dir) {
    for (const char* tool : {"munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo"})
      if (run_command(std::string("command -v ") + tool + " >/dev/null 2>&1 || test -x /usr/sbin/" + tool).exit_code != 0)
        FAIL(tool << " is missing: tools/install-deps.sh installs Debian's slurmctld, slurmd, slurm-client and munge");
    REQUIRE(run_command("mkdir -p " + dir_ + "/munge " + dir_ + "/state " + dir_ + "/spool " + dir_ + "/log && chmod 700 " +
                        dir_ + "/munge && /usr/sbin/mungekey -c -k " + dir_ + "/munge/munge.key").exit_code == 0);
    write_conf(free_tcp_port(), free_tcp_port());
    munged_ = daemon("/usr/sbin/munged -F --force --key-file=" + dir_ + "/munge/munge.key --socket=" + socket() +
                     " --pid-file=" + dir_ + "/munge/munged.pid --seed-file=" + dir_ + "/munge/seed --log-file=" + dir_ +
                     "/log/munged.log", "munged");
    wait_for("munge", "/usr/bin/munge -n -S " + socket() + " | /usr/bin/unmunge -S " + socket() + " >/dev/null");
    ctld_ = daemon("/usr/sbin/slurmctld -D -i -f " + conf(), "slurmctld");
    slurmd_ = daemon("/usr/sbin/slurmd -D -N localhost -f " + conf(), "slurmd");
    wait_for("the Slurm node", env() + "sinfo -h -N -o %T | grep -qx idle");
  }
  ~LocalSlurm() { stop(); }
  LocalSlurm(const LocalSlurm&) = delete;
  LocalSlurm& operator=(const LocalSlurm&) = delete;

  const std::string& dir() const { return dir_; }
  std::string conf() const { return dir_ + "/slurm.conf"; }
  // Prefix for Slurm client commands run through the shell.
  std::string env() const { return "SLURM_CONF=" + conf() + " "; }

  // Cancels every job and waits (up to `timeout`) until the queue is empty; true when it is.
  bool cancel_all(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    run_command(env() + "scancel --full --quiet --user=$(id -un) 2>/dev/null");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto q = run_command(env() + "squeue -h -o %i 2>/dev/null");
      if (q.exit_code == 0 && q.out.empty()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return false;
  }

  void stop() {
    if (!slurmd_) return;
    cancel_all();
    for (auto* p : {&slurmd_, &ctld_, &munged_}) {
      if (!*p) continue;
      ::kill((*p)->pid(), SIGTERM);
      (*p)->wait_exit(std::chrono::seconds(15));  // SIGKILL after that
      p->reset();
    }
  }

 private:
  std::string socket() const { return dir_ + "/munge/munge.sock"; }

  // A daemon in the foreground, its console output in log/<name>.console (the shell execs into it: the
  // guard's pid is the daemon's).
  std::unique_ptr<ProcessGuard> daemon(const std::string& cmd, const std::string& name) {
    return std::make_unique<ProcessGuard>(
        "/bin/sh", std::vector<std::string>{"-c", "exec " + cmd + " >>" + dir_ + "/log/" + name + ".console 2>&1"});
  }

  void wait_for(const std::string& what, const std::string& cmd) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (run_command("{ " + cmd + "; } 2>/dev/null").exit_code != 0) {
      if (std::chrono::steady_clock::now() > deadline) FAIL(what << " did not come up; logs in " << dir_ << "/log");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  void write_conf(int ctld_port, int slurmd_port) {
    const long cpus = std::max(2L, ::sysconf(_SC_NPROCESSORS_ONLN));
    std::ofstream c(conf());
    c << "ClusterName=k3test\n"
      << "SlurmctldHost=localhost(127.0.0.1)\n"
      << "SlurmctldPort=" << ctld_port << "\nSlurmdPort=" << slurmd_port << "\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << socket() << "\n"
      << "StateSaveLocation=" << dir_ << "/state\nSlurmdSpoolDir=" << dir_ << "/spool\n"
      << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\nSlurmdPidFile=" << dir_ << "/slurmd.pid\n"
      << "SlurmctldLogFile=" << dir_ << "/log/slurmctld.log\nSlurmdLogFile=" << dir_ << "/log/slurmd.log\n"
      // No cgroups in a container: processes are tracked by parentage; tasks are not bound.
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
      << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
      << "MpiDefault=none\nJobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
      << "ReturnToService=2\nSchedulerType=sched/builtin\nKillWait=5\n"
      << "NodeName=localhost NodeAddr=127.0.0.1 CPUs=" << cpus << " State=UNKNOWN\n"
      << "PartitionName=k3 Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8\n";
  }

  std::string dir_;
  std::unique_ptr<ProcessGuard> munged_, ctld_, slurmd_;
};

}  // namespace k3::test
